"""``specdraft serve`` without vLLM: the exact command it builds (capture, sizes, names, reasoning
parser), and the foreground life of the process (ready, printed, stopped with its whole group
on Ctrl-C or on its own exit), with a stand-in server program. The real server:
``tests/engine/test_live_capture.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdraft.core.errors import ConfigError
from specdraft.engines.capture import parse_descriptor
from specdraft.engines.launcher import free_port
from specdraft.engines.live import SERVER_MODULE, prepare
from specdraft.engines.live_config import ServeConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "extract"))
from extract_helpers import write_prepared  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
#: A stand-in for ``python -m vllm.entrypoints.openai.api_server``: answers every GET with 200 on
#: ``--port``, starts a sleeping child (to show the whole group is stopped), writes both pids.
FAKE = """#!{python}
import http.server, os, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open({pids!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
        if {exit_after_health}:
            os._exit(3)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture
def run_dir(tmp_path):
    return write_prepared(tmp_path / "run", [[1, 2, 3]], [[0, 1, 1]])


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_command_has_the_capture_names_and_sizes(run_dir, tiny_verifier_dir):
    cfg = ServeConfig(run_dir=run_dir, verifier=str(tiny_verifier_dir), aux_layers=(1, 2, 3),
                      port=8123, dtype="float32", tensor_parallel_size=2,
                      pipeline_parallel_size=3, data_parallel_size=4, max_model_len=512,
                      extra_args="--enforce-eager --max-num-seqs 8",
                      engine_python=sys.executable)
    cmd, url = prepare(cfg)
    assert url == "http://127.0.0.1:8123"
    assert cmd[:3] == [sys.executable, "-m", SERVER_MODULE]
    assert _flag(cmd, "--model") == str(tiny_verifier_dir)
    i = cmd.index("--served-model-name")
    assert cmd[i + 1] == tiny_verifier_dir.name and parse_descriptor(cmd[i + 2:i + 3]) == \
        [1, 2, 3, 4]  # aux ids + N = 4
    assert [_flag(cmd, f) for f in ("--dtype", "--tensor-parallel-size",
                                    "--pipeline-parallel-size", "--data-parallel-size",
                                    "--max-model-len", "--port", "--host")] == \
        ["float32", "2", "3", "4", "512", "8123", "127.0.0.1"]
    spec = json.loads(_flag(cmd, "--speculative-config"))
    assert spec == {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                    "draft_model_config": {"hf_config": {
                        "eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}}}
    kv = json.loads(_flag(cmd, "--kv-transfer-config"))
    assert kv["kv_connector"] == "SpecdraftHiddenStatesConnector"
    assert kv["kv_connector_module_path"] == "specdraft.extract.vllm_connector"
    extra = kv["kv_connector_extra_config"]
    assert extra["specdraft_named_only"] is True and extra["allow_custom_save_path"] is True
    assert extra["shared_storage_path"] == str((run_dir / "serve" / "capture").resolve())
    assert "--no-enable-prefix-caching" in cmd and "--reasoning-parser" not in cmd
    assert cmd[-3:] == ["--enforce-eager", "--max-num-seqs", "8"]


def test_aux_ids_from_the_runs_extract_plan(run_dir, tiny_verifier_dir):
    (run_dir / "extract").mkdir()
    (run_dir / "extract" / "plan.json").write_text(json.dumps({"aux_layer_ids": [1, 3]}))
    cmd, _ = prepare(ServeConfig(run_dir=run_dir, verifier=str(tiny_verifier_dir),
                                 engine_python=sys.executable))
    spec = json.loads(_flag(cmd, "--speculative-config"))
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == \
        [1, 3, 4]


@pytest.mark.parametrize("given, model_type, expected", [
    ("auto", "qwen3", "qwen3"), ("auto", "kimi_k2", "kimi_k2"), ("none", "qwen3", None),
    ("deepseek_r1", "llama", "deepseek_r1"),
])
def test_reasoning_parser_when_the_template_thinks(monkeypatch, run_dir, given, model_type,
                                                   expected):
    from specdraft.artifacts import verifier_contract
    from specdraft.engines.live import reasoning_parser

    think = SimpleNamespace(opener="<think>", closer="</think>")
    monkeypatch.setattr(verifier_contract, "run_verifier",
                        lambda _: SimpleNamespace(chat=SimpleNamespace(think=think)))
    cfg = ServeConfig(run_dir=run_dir, reasoning_parser=given)
    assert reasoning_parser(cfg, model_type) == expected


def test_reasoning_parser_unknown_family_is_refused_by_flag(monkeypatch, run_dir):
    from specdraft.artifacts import verifier_contract
    from specdraft.engines.live import reasoning_parser

    think = SimpleNamespace(opener="<think>", closer="</think>")
    monkeypatch.setattr(verifier_contract, "run_verifier",
                        lambda _: SimpleNamespace(chat=SimpleNamespace(think=think)))
    with pytest.raises(ConfigError, match="pass --reasoning-parser NAME or none"):
        reasoning_parser(ServeConfig(run_dir=run_dir), "llama")
    monkeypatch.setattr(verifier_contract, "run_verifier",
                        lambda _: SimpleNamespace(chat=SimpleNamespace(think=None)))
    assert reasoning_parser(ServeConfig(run_dir=run_dir), "qwen3") is None


def _fake(tmp_path: Path, exit_after_health: bool) -> tuple[Path, Path]:
    pids = tmp_path / "pids"
    script = tmp_path / "fake-python"
    script.write_text(FAKE.format(python=sys.executable, pids=str(pids),
                                  exit_after_health=exit_after_health))
    script.chmod(0o755)
    return script, pids


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie awaiting its parent counts as gone
            return f.read().split(") ")[1].startswith("Z")
    except FileNotFoundError:  # reaped between the two looks
        return True


def _gone_within(pid: int, seconds: float = 30.0) -> bool:
    """``_gone`` polled until ``seconds`` pass (a bound for a hang on a busy machine, not a
    speed check: a stopped group may take a moment to be reaped)."""
    deadline = time.monotonic() + seconds
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_ctrl_c_stops_the_whole_group(tmp_path, run_dir, tiny_verifier_dir):
    script, pids = _fake(tmp_path, exit_after_health=False)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "specdraft.cli", "serve", "--run-dir",
                             str(run_dir), "--verifier", str(tiny_verifier_dir), "--port",
                             str(port), "--engine-python", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        deadline = time.monotonic() + 120
        while not any(ln.startswith("serve: command:") for ln in lines):
            assert time.monotonic() < deadline and proc.poll() is None, lines
            lines.append(proc.stdout.readline())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    out = "".join(lines) + proc.stdout.read()
    assert f"serve: http://127.0.0.1:{port}/v1" in out and "serve: stopped" in out
    assert f"-m {SERVER_MODULE} --model {tiny_verifier_dir}" in out
    server, child = map(int, pids.read_text().split())
    assert _gone_within(server) and _gone_within(child)


def test_a_server_that_exits_is_an_error_with_its_log(tmp_path, run_dir, tiny_verifier_dir):
    from specdraft.engines.live import serve
    from specdraft.engines.process import EngineError

    script, pids = _fake(tmp_path, exit_after_health=True)
    cfg = ServeConfig(run_dir=run_dir, verifier=str(tiny_verifier_dir), port=free_port(),
                      engine_python=str(script), startup_s=60)
    with pytest.raises(EngineError, match="the vLLM server exited with status 3"):
        serve(cfg, out=open(os.devnull, "w"))
    _, child = map(int, pids.read_text().split())
    assert _gone_within(child)
