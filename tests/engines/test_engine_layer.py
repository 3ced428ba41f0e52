"""The engine layer (docs/architecture.md): one error type, one way to stop an engine, one python
lookup per engine, one rule for ``dtype: auto``."""

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdraft.core.verifier import resolve_dtype
from specdraft.engines import process
from specdraft.engines.python import engine_python, sglang_python

SRC = Path(__file__).resolve().parents[2] / "src" / "specdraft"


def defined_errors(src: Path = SRC) -> dict[str, list[str]]:
    """Exception classes (names ending in Error) -> the modules that define one of that name."""
    found: dict[str, list[str]] = {}
    for path in sorted(src.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                found.setdefault(node.name, []).append(str(path.relative_to(src)))
    return found


def test_every_error_type_is_defined_once():
    errors = defined_errors()
    assert errors["EngineError"] == ["engines/process.py"]
    assert {k: v for k, v in errors.items() if len(v) > 1} == {}


def test_a_second_engine_error_would_be_caught(tmp_path):
    """Planted fault: the two EngineError classes this layer replaced."""
    for mod in ("eval", "extract"):
        (tmp_path / mod).mkdir()
        (tmp_path / mod / "engine.py").write_text("class EngineError(RuntimeError):\n    pass\n")
    assert defined_errors(tmp_path) == {"EngineError": ["eval/engine.py", "extract/engine.py"]}


@pytest.mark.parametrize("dtype, device, want", [
    ("auto", "cpu", "float32"), ("auto", "cuda", "bfloat16"), ("auto", "cuda:3", "bfloat16"),
    ("bfloat16", "cpu", "bfloat16"), ("float32", "cuda", "float32"),
    ("float16", "cuda", "float16")])
def test_one_rule_for_auto_dtype(dtype, device, want):
    assert resolve_dtype(dtype, device) == want


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


@pytest.mark.timeout(120)
def test_stop_reaches_what_the_engine_spawned(tmp_path):
    """An engine that ignores SIGTERM and has a child of its own: both are gone after stop()."""
    pidfile = tmp_path / "child"
    script = ("import signal, subprocess, sys, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
              f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
              "time.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    while not pidfile.exists() or not pidfile.read_text():
        assert proc.poll() is None
        time.sleep(0.05)
    child = int(pidfile.read_text())
    process.stop(proc, grace_s=1)
    time.sleep(0.2)
    assert proc.poll() is not None and not _alive(child)


def test_python_lookup_per_engine(tmp_path, monkeypatch):
    py = tmp_path / "python"
    py.write_text("")
    monkeypatch.setenv("SPECDRAFT_SGLANG_PYTHON", "/opt/sglang/bin/python")
    assert sglang_python() == engine_python("sglang") == "/opt/sglang/bin/python"
    assert engine_python("sglang", str(py)) == str(py)
    monkeypatch.delenv("SPECDRAFT_SGLANG_PYTHON")
    assert sglang_python() == sys.executable
    monkeypatch.setenv("SPECDRAFT_VLLM_PYTHON", str(py))
    assert engine_python("vllm") == str(py)


def test_one_counter_formula_for_the_worker_and_the_server():
    """The same counts read from the in-process worker and from two /metrics snapshots give
    the same figures: τ = 1 + 6/4, rate 6/12, positions [3, 2, 1]/4 (worked by hand)."""
    from specdraft.eval.engine import figures
    from specdraft.eval.server import vllm_counters, vllm_summary

    def metrics(drafts, tokens, accepted, per_pos):
        lines = [f"vllm:spec_decode_num_drafts_total {drafts}",
                 f"vllm:spec_decode_num_draft_tokens_total {tokens}",
                 f"vllm:spec_decode_num_accepted_tokens_total {accepted}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {a}'
                  for i, a in enumerate(per_pos)]
        return "\n".join(lines)

    worker = figures({"drafts": 4, "draft_tokens": 12, "accepted": 6, "per_pos": [3, 2, 1]})
    server = vllm_summary(vllm_counters(metrics(10, 30, 9, [5, 3, 1])),
                          vllm_counters(metrics(14, 42, 15, [8, 5, 2])))
    assert server.pop("engine") == "vllm"
    assert server == worker
    assert worker["tau"] == 2.5 and worker["acceptance_rate"] == 0.5
    assert worker["per_position"] == [0.75, 0.5, 0.25]
    with pytest.raises(process.EngineError, match="did not move"):
        vllm_summary(vllm_counters(metrics(4, 12, 6, [3])), vllm_counters(metrics(4, 12, 6, [3])))


def test_equal_counts_give_bit_equal_tau_offline_and_in_the_engine():
    """3 verify steps that accept 2 drafts: offline τ = committed / steps = 5 / 3 and the
    engine's from its counters must be the same float, or the float32 gate's "gap == 0" fails on
    counts that agree (1 + 2/3 is 1.6666666666666665, 5/3 is 1.6666666666666667)."""
    from specdraft.eval.acceptance import AcceptanceStats
    from specdraft.eval.engine import figures

    offline = AcceptanceStats()
    for accepted in (2, 0, 0):
        offline.add(3, accepted, accepted + 1)
    engine = figures({"drafts": 3, "draft_tokens": 9, "accepted": 2, "per_pos": [1, 1, 0]})
    assert offline.tau == engine["tau"] == 5 / 3


def test_cpu_mla_backend_only_off_bf16_on_a_cpu_torch():
    """engines/vllm_cpu.py (this CPU torch): float32 asks for CPU_MLA, for the verifier and an
    EAGLE-3 draft; bf16 and auto leave vLLM's own choice; both workers use this very module
    (one import policy, :mod:`specdraft.engines.worker`)."""
    from specdraft.engines import vllm_cpu
    from specdraft.eval import engine_worker

    assert vllm_cpu.attention_kwargs("float32") == {"attention_config": {"backend": "CPU_MLA"}}
    assert vllm_cpu.draft_attention_kwargs("float32") == {"attention_backend": "CPU_MLA"}
    assert vllm_cpu.attention_kwargs("bfloat16") == vllm_cpu.attention_kwargs("auto") == {}
    assert vllm_cpu.draft_attention_kwargs("bfloat16") == {}
    from specdraft.extract import vllm_worker

    assert engine_worker.attention_kwargs is vllm_cpu.attention_kwargs
    assert engine_worker.draft_attention_kwargs is vllm_cpu.draft_attention_kwargs
    assert vllm_worker.attention_kwargs is vllm_cpu.attention_kwargs


def test_counters_read_once_from_the_worker_and_from_metrics_text():
    """The same counts, as ``LLM.get_metrics()`` objects (two engines: summed) and as the
    Prometheus text of a server (``_total`` names, ``position`` labels, ``_created`` lines
    ignored), read by the one reader to the same counters; differenced by hand."""
    from dataclasses import dataclass

    from specdraft.engines.counters import (counter_difference, metrics_samples,
                                            prometheus_samples, spec_counters)
    from specdraft.eval.engine_worker import counters

    @dataclass
    class Counter:  # the fields of vLLM's v1/metrics/reader.py Counter and Vector
        name: str
        value: int

    @dataclass
    class Vector:
        name: str
        values: list

    snap = [Counter("vllm:spec_decode_num_drafts", 3), Counter("vllm:spec_decode_num_drafts", 1),
            Counter("vllm:spec_decode_num_draft_tokens", 12),
            Counter("vllm:spec_decode_num_accepted_tokens", 6),
            Vector("vllm:spec_decode_num_accepted_tokens_per_pos", [2, 1, 1]),
            Vector("vllm:spec_decode_num_accepted_tokens_per_pos", [1, 1]),
            Counter("vllm:num_requests_running", 7)]
    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total drafts", 'vllm:spec_decode_num_drafts_total'
        '{engine="0"} 3', 'vllm:spec_decode_num_drafts_total{engine="1"} 1',
        "vllm:spec_decode_num_drafts_created 1.7e9",
        "vllm:spec_decode_num_draft_tokens_total 12",
        "vllm:spec_decode_num_accepted_tokens_total 6",
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 2',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="0"} 1',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 2',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 1'])
    want = {"drafts": 4, "draft_tokens": 12, "accepted": 6, "per_pos": [3, 2, 1]}
    assert counters(snap) == spec_counters(metrics_samples(snap)) == want
    assert spec_counters(prometheus_samples(text)) == want
    before = {"drafts": 1, "draft_tokens": 3, "accepted": 1, "per_pos": [1]}
    assert counter_difference(before, want) == {"drafts": 3, "draft_tokens": 9, "accepted": 5,
                                                 "per_pos": [2, 2, 1]}
