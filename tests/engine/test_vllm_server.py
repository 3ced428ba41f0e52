"""`specdraft generate --backend openai` against a real vLLM server (SmolLM2-135M-Instruct,
converted from the GGUF to HF once), then `specdraft prepare`: each dataset row is exactly the
server's ``prompt_token_ids + completion_token_ids``, supervised on the completion only."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import time

import httpx
import pytest

pytestmark = pytest.mark.slow
QUESTIONS = ["What is 2+2?", "Name a primary colour.", "Say hello in French."]
MAX_TOKENS = 48


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def smollm2_hf(tmp_path_factory):
    from specdraft.engines.verifier_dir import gguf_to_hf_dir

    return gguf_to_hf_dir("smollm2", tmp_path_factory.mktemp("smollm2") / "hf")


@pytest.fixture(scope="module")
def vllm_server(vllm_python, smollm2_hf, tmp_path_factory):
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 (float32, eager); its
    process group is stopped in a finally."""
    from specdraft.engines.process import stop as stop_engine

    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm_server") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": ""}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_hf),
             "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port),
             "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 400
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited: {log_path.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"vLLM did not come up: {log_path}"
            time.sleep(1)
        yield url
    finally:
        stop_engine(proc)


def test_generate_against_vllm_then_prepare_has_the_servers_ids(vllm_server, smollm2_hf,
                                                                tmp_path):
    import datasets

    from specdraft.generate.config import GenerateConfig
    from specdraft.generate.run import run as generate
    from specdraft.prepare.config import PrepareConfig
    from specdraft.prepare.run import run as prepare

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "question": q}) + "\n"
                               for i, q in enumerate(QUESTIONS)))
    run_dir = tmp_path / "run"
    generate(GenerateConfig(prompts=str(prompts), run_dir=str(run_dir), backend="openai",
                            endpoint=[vllm_server], concurrency=3, max_tokens=MAX_TOKENS,
                            keep_truncated=True, timeout_s=300, verifier=str(smollm2_hf)),
             stream=io.StringIO())
    samples = [json.loads(line) for line in (run_dir / "generate" / "samples.jsonl").open()]
    assert sorted(s["id"] for s in samples) == ["q0", "q1", "q2"]
    prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(smollm2_hf)))
    ds = datasets.load_from_disk(str(run_dir / "prepare" / "dataset"))
    rows = {r["sample_id"]: r for r in ds}
    assert set(rows) == {"q0", "q1", "q2"}
    stopped = 0
    for s in samples:
        turn = s["turns"][0]
        p, c = turn["prompt_token_ids"], turn["completion_token_ids"]
        assert p and c, "vLLM returns token ids (return_token_ids)"
        row = rows[s["id"]]
        assert row["input_ids"] == p + c, s["id"]
        assert row["loss_mask"] == [0] * len(p) + [1] * len(c), s["id"]
        stopped += turn["finish_reason"] == "stop"
    assert stopped >= 1  # at least one answer ends with the model's own stop token
