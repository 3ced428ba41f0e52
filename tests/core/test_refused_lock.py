"""A refused command leaves the run's lock as it found it, and its advice names only the flags
its stage has (issue: eval said "pass --resume" and rewrote the lock's holder line)."""

from __future__ import annotations

import json

import pytest

from specdraft.core import lock
from specdraft.core.errors import StageDirError
from specdraft.core.rundir import open_stage_dir


def _finished_stage(tmp_path, stage):
    d = tmp_path / stage
    d.mkdir(parents=True)
    (d / "manifest.json").write_text("{}")
    holder = json.dumps({"pid": 4242, "host": "h", "command": "specdraft eval",
                         "started_at": "2026-12-04T00:00:00Z"}) + "\n"
    (d / lock.LOCK_FILE).write_text(holder)
    return d, holder


def test_refusal_keeps_the_lock_file_and_names_existing_flags(tmp_path):
    d, holder = _finished_stage(tmp_path, "eval")
    with pytest.raises(StageDirError) as err:
        open_stage_dir(tmp_path, "eval", resumable=False)
    assert "--resume" not in str(err.value) and "pass --overwrite" in str(err.value)
    assert (d / lock.LOCK_FILE).read_text() == holder  # byte for byte
    assert not lock.holds(d)  # released: a later run in this process may take it


def test_resumable_stage_names_both_and_an_accepted_run_claims(tmp_path):
    d, holder = _finished_stage(tmp_path, "vocab")
    with pytest.raises(StageDirError, match="pass --resume to continue it or --overwrite"):
        open_stage_dir(tmp_path, "vocab")
    assert (d / lock.LOCK_FILE).read_text() == holder
    open_stage_dir(tmp_path, "vocab", overwrite=True)
    import os

    assert json.loads((d / lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (d / "manifest.json").exists()
    lock.release(d)
