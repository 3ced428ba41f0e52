"""``--backend vllm`` faults through the real CLI: kill -9 mid-extraction then ``--resume``, and
an engine that fails (its own error is reported, nothing half-written is left)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from killing import kill9_when

from specdraft.extract.config import ExtractConfig
from specdraft.extract.run import run
from specdraft.artifacts.hidden_states import DiskSource

from extract_helpers import random_rows, write_prepared
from vllm_helpers import compare_sources, engine_env, make_vllm_tiny

CLI = [sys.executable, "-c", "from specdraft.cli import main; main()", "extract"]
AUX = (1, 2, 3)


@pytest.fixture(scope="module")
def verifier(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    return make_vllm_tiny(tmp_path_factory.mktemp("vllm_faults") / "v", smollm2_tokenizer_dir)


def flags(run_dir: Path, verifier: Path, *extra: str) -> list[str]:
    return ["--run-dir", str(run_dir), "--verifier", str(verifier), "--aux-layers", "1,2,3",
            "--batch-tokens", "64", "--storage", "bf16", "--shard-mb", "0.04", "--dtype",
            "float32", "--backend", "vllm", *extra]


def engine_alive(job_dir: Path) -> bool:
    """Whether any process still runs the worker of ``job_dir`` (reads /proc, kills nothing)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(job_dir).encode() in cmdline.read_bytes():
                return True
        except OSError:
            continue
    return False


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kill9_then_resume_every_row_once(tmp_path, verifier):
    lens = [20 + (11 * i) % 40 for i in range(36)]
    ids, masks = random_rows(lens, vocab=2000, seed=2)
    killed = write_prepared(tmp_path / "killed", ids, masks)
    out = killed / "extract"
    shards = out / "shards"
    kill9_when(CLI + flags(killed, verifier), env=engine_env(), timeout_s=300,
               ready=lambda: shards.exists() and len(list(shards.glob("*.safetensors"))) >= 2)
    assert not (out / "manifest.json").exists() and not (out / "index.jsonl").exists()
    deadline = time.monotonic() + 20
    while engine_alive(out / "vllm" / "rank00000") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not engine_alive(out / "vllm" / "rank00000"), "the engine outlived its parent"
    done = subprocess.run(CLI + flags(killed, verifier, "--resume"), env=engine_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["throughput"][0]["shards_resumed"] >= 1
    index = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert [e["row"] for e in index] == list(range(36))  # every row exactly once
    assert [e["key"] for e in index] == [f"s{i:03d}/0" for i in range(36)]
    listed = {e["shard"].removeprefix("shards/") for e in index}
    assert listed == {p.name for p in shards.iterdir()}  # no orphan, no temp file
    ref = write_prepared(tmp_path / "ref", ids, masks)  # reference: transformers backend
    run(ExtractConfig(run_dir=ref, verifier=str(verifier), aux_layers=AUX, batch_tokens=64,
                      storage="bf16", shard_mb=0.04, dtype="float32", device="cpu"))
    ratios = compare_sources(DiskSource(ref / "extract"), DiskSource(out), AUX, 128,
                             rel=2**-7, floor=1e-5)
    assert max(ratios.values()) <= 1.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_engine_failure_is_reported_with_its_error(tmp_path, verifier):
    ids, masks = random_rows([30, 25, 20], vocab=2000, seed=3)
    run_dir = write_prepared(tmp_path / "run", ids, masks)
    done = subprocess.run(CLI + flags(run_dir, verifier, "--engine-args",
                                      '{"max_model_len": 16}'),
                          env=engine_env(), capture_output=True, text=True)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    error = next(i for i, ln in enumerate(lines) if ln.startswith("specdraft: error:"))
    assert "vLLM engine exited with status 1" in lines[error], lines[error]
    assert "maximum context length is 16" in lines[error], lines[error]  # the engine's words
    assert all(ln.startswith("  | ") for ln in lines[error + 1:])  # then the log's last lines
    assert "Traceback" not in "\n".join(lines[:error + 1])  # none of specdraft's own
    out = run_dir / "extract"
    assert not (out / "manifest.json").exists() and not (out / "index.jsonl").exists()
    assert list((out / "shards").iterdir()) == []
    assert (out / "vllm" / "rank00000" / "engine.log").exists()
