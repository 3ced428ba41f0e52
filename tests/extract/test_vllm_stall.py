"""``extract --backend vllm`` with an engine that starts and then hangs without writing: the
no-progress timeout stops it (and what it spawned), the stage fails naming the flag, and nothing
half-written is left. The engine is a fake python (``--engine-python``): no vLLM needed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from extract_helpers import random_rows, write_prepared

CLI = [sys.executable, "-c", "from specdraft.cli import main; main()", "extract"]


def hanging_python(tmp_path: Path) -> Path:
    """Called as ``PY -m specdraft.extract.vllm_worker JOB_DIR``: writes its pid and a
    grandchild's, one log line, then hangs without writing a row."""
    py = tmp_path / "hanging-python"
    py.write_text(
        f"#!{sys.executable}\n"
        "import os, subprocess, sys, time\n"
        "assert sys.argv[1:3] == ['-m', 'specdraft.extract.vllm_worker'], sys.argv\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(tmp_path / 'pids')!r}, 'w').write(f'{{os.getpid()}} {{g.pid}}')\n"
        "print('INFO building the engine', flush=True)\n"
        "time.sleep(300)\n")
    py.chmod(0o755)
    return py


def alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


@pytest.mark.timeout(300)
def test_a_hung_engine_is_stopped_by_the_no_progress_timeout(tmp_path, tiny_verifier_dir):
    ids, masks = random_rows([30, 25, 20], vocab=1000, seed=4)
    run_dir = write_prepared(tmp_path / "run", ids, masks)
    t0 = time.monotonic()
    done = subprocess.run(CLI + [
        "--run-dir", str(run_dir), "--verifier", str(tiny_verifier_dir), "--aux-layers", "1,2,3",
        "--dtype", "float32", "--device", "cpu", "--backend", "vllm", "--engine-python",
        str(hanging_python(tmp_path)), "--engine-no-progress-s", "3"],
        capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert done.returncode == 2, done.stderr[-3000:]
    error = next(ln for ln in done.stderr.splitlines() if ln.startswith("specdraft: error:"))
    assert error == (
        "specdraft: error: the vLLM engine made no progress for 3 s (its log and outputs did not "
        "change; raise --engine-no-progress-s if it needs longer); stopped: INFO building the "
        f"engine (full log: {run_dir / 'extract' / 'vllm' / 'rank00000' / 'engine.log'})")
    assert "  | INFO building the engine" in done.stderr and "Traceback" not in done.stderr
    assert took >= 3
    engine, grandchild = map(int, (tmp_path / "pids").read_text().split())
    deadline = time.monotonic() + 10
    while (alive(engine) or alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(engine) and not alive(grandchild)
    out = run_dir / "extract"
    assert not (out / "manifest.json").exists() and not (out / "index.jsonl").exists()
    assert not (out / "shards").exists() or list((out / "shards").iterdir()) == []
