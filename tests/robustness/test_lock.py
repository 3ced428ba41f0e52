"""Two processes on one stage: the second is refused naming the first; a killed holder's lock
is taken over (:mod:`specdraft.core.lock`, taken by ``open_stage_dir``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from malformed import write_lines
from specdraft.generate.fakeserver import LoopbackServer

SRC = str(Path(__file__).resolve().parents[2] / "src")
HOLD = ("import sys, time\n"
        "from specdraft.core import lock\n"
        "lock.acquire(sys.argv[1], what='specdraft test')\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n")


def _holder(directory: Path) -> subprocess.Popen:
    """A process that holds ``directory``'s lock until killed."""
    env = {**os.environ, "PYTHONPATH": SRC}
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), "--tag", "holder-x"],
                         stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "held"
    return p


def _kill(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)


@pytest.fixture
def server():
    with LoopbackServer() as url:
        yield url


def test_second_stage_run_refused_then_takes_over_a_killed_holder(tmp_path, cli, server):
    run = tmp_path / "run"
    prompts = write_lines(tmp_path / "p.jsonl", [{"question": "q1"}])
    args = ["generate", "--prompts", prompts, "--run-dir", run, "--backend", "openai",
            "--endpoint", server, "--max-tokens", "8"]
    holder = _holder(run / "generate")
    try:
        err = cli(*args).error
        assert f"pid {holder.pid} on {socket.gethostname()}" in err, err
        assert "holder-x" in err and "in use by another `specdraft generate`" in err
        assert not (run / "generate" / "manifest.json").exists()
    finally:
        _kill(holder)  # kill -9: the kernel drops its flock
    res = cli(*args)
    assert res.code == 0, res.err
    assert json.loads((run / "generate/manifest.json").read_text())["counts"]["samples"] == 1


def test_second_pipeline_run_refused(tmp_path, cli):
    run = tmp_path / "run"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run_dir: {run}\ngenerate: {{prompts: builtin:demo_train}}\n"
                   "eval: {prompts: builtin:demo_train}\n")
    holder = _holder(run / "run")
    try:
        err = cli("run", cfg).error
        assert f"pid {holder.pid}" in err and "`specdraft run`" in err, err
    finally:
        _kill(holder)


def test_lock_released_when_the_stage_completes(tmp_path):
    from specdraft.core import lock
    from specdraft.core.manifest import StageClock, write_manifest
    from specdraft.core.rundir import open_stage_dir
    from specdraft.core.config import StageConfig

    class Cfg(StageConfig):
        x: int = 0

    out = open_stage_dir(tmp_path, "vocab")
    assert lock.holds(out)
    assert open_stage_dir(tmp_path, "vocab", resume=True) == out  # same process: re-entrant
    write_manifest(out, stage="vocab", config=Cfg(), clock=StageClock(), extra={"vocab": {
        "draft_vocab_size": 1, "verifier_vocab_size": 1, "coverage": 1.0}})
    assert not lock.holds(out)
    holder = _holder(out)  # another process can take it now
    _kill(holder)


def test_failed_start_leftovers_do_not_block(tmp_path):
    from specdraft.core.rundir import open_stage_dir

    stage = tmp_path / "prepare"
    stage.mkdir()
    (stage / "rejects.jsonl.tmp-99999").write_text('{"id": 1}\n')  # a dead run's temp file
    (stage / "rejects.jsonl").write_text("")                      # an empty file: no work
    assert open_stage_dir(tmp_path, "prepare") == stage
    assert sorted(p.name for p in stage.iterdir()) == [".lock"]
    (stage / "rejects.jsonl").write_text('{"id": 1}\n')  # real work: still refused
    from specdraft.core.errors import StageDirError

    with pytest.raises(StageDirError, match="partial output"):
        open_stage_dir(tmp_path, "prepare")
