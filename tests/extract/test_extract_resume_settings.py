"""An extract resume cannot drift: a changed storage, aux layer set, verifier or batching is
refused naming the field (old → new); ``--verify``/``--seed`` may change and are recorded."""

from __future__ import annotations

import json

import pytest

from specdraft.core.errors import StageDirError
from specdraft.core.resume import SETTINGS_FILE
from test_run import extract, prepared


@pytest.fixture
def started(tmp_path, tiny_model):
    """A finished extraction (its manifest removed on resume like any other)."""
    run_dir, _, _ = prepared(tmp_path)
    extract(run_dir, tiny_model)
    return run_dir


@pytest.mark.parametrize("changed, message", [
    ({"storage": "bf16"}, "--storage 'fp32' → 'bf16'"),
    ({"aux_layers": (1, 3)}, "--aux-layers [1, 2, 3] → [1, 3]"),
    ({"verifier": "other"}, "--verifier 'tiny' → 'other'"),
    ({"batch_tokens": 200, "storage": "fp8"}, "--batch-tokens 155 → 200; --storage 'fp32' → "
                                              "'fp8'"),
])
def test_changed_setting_refused_naming_it(started, tiny_model, changed, message):
    before = (started / "extract" / "index.jsonl").read_bytes()
    with pytest.raises(StageDirError) as err:
        extract(started, tiny_model, resume=True, **changed)
    text = str(err.value)
    assert message in text and SETTINGS_FILE in text and "--overwrite" in text
    assert (started / "extract" / "index.jsonl").read_bytes() == before


def test_allowed_change_applied_and_recorded(started, tiny_model):
    m = extract(started, tiny_model, resume=True, verify=2, seed=5)
    assert m["resume_changes"] == {"verify": [0, 2], "seed": [0, 5]}
    assert m["verify"]["ok"] and m["config"]["verify"] == 2
    stored = json.loads((started / "extract" / SETTINGS_FILE).read_text())
    assert stored["verify"] == 2  # the next resume compares with these


def test_settings_file_alone_is_not_work(tmp_path, tiny_model):
    """A start that died right after writing its settings is no partial output."""
    run_dir, _, _ = prepared(tmp_path)
    (run_dir / "extract").mkdir()
    (run_dir / "extract" / SETTINGS_FILE).write_text('{"storage": "fp8"}')
    assert extract(run_dir, tiny_model)["resume_changes"] == {}


def test_the_engine_stall_limit_may_change_on_resume(started, tiny_model):
    """--engine-no-progress-s decides only when a stuck engine is stopped: a resume after a
    stall may raise it, and a run recorded before the setting existed (no key) resumes."""
    m = extract(started, tiny_model, resume=True, engine_no_progress_s=1200)
    assert m["resume_changes"] == {"engine_no_progress_s": [600.0, 1200.0]}
    path = started / "extract" / SETTINGS_FILE
    stored = json.loads(path.read_text())
    del stored["engine_no_progress_s"]
    path.write_text(json.dumps(stored))
    m = extract(started, tiny_model, resume=True)
    assert m["resume_changes"] == {"engine_no_progress_s": [None, 600.0]}
