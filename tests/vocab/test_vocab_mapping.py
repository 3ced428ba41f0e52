"""Draft vocabulary: d2t/t2d maps and selection, values by hand; the stage end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdraft.vocab import mapping


def test_maps_by_hand():
    d2t, t2d = mapping.build_maps(np.array([0, 3, 4, 9, 15]), 16)
    assert d2t.dtype == np.int64 and d2t.tolist() == [0, 2, 2, 6, 11]
    assert t2d.dtype == bool and np.flatnonzero(t2d).tolist() == [0, 3, 4, 9, 15]
    assert (np.arange(5) + d2t).tolist() == [0, 3, 4, 9, 15]


def test_full_vocab():
    counts = np.array([5, 0, 2, 0, 1, 0, 0, 9])
    sel = mapping.select_ids(counts, 8, forced=[])
    d2t, t2d = mapping.build_maps(sel, 8)
    assert d2t.tolist() == [0] * 8 and t2d.all()
    assert mapping.select_ids(counts, 100, forced=[]).tolist() == list(range(8))


def test_fill_when_few_distinct():
    # corpus of 7 distinct ids; K=10, V=50: the 7 seen plus the 3 lowest unused ids (0, 1, 2)
    seen = [5, 17, 23, 31, 42, 48, 49]
    ids = np.array(seen + [17, 17, 42])
    mask = np.ones_like(ids)
    counts = mapping.count_supervised(ids, mask, 50)
    sel = mapping.select_ids(counts, 10, forced=[])
    assert sel.tolist() == [0, 1, 2, 5, 17, 23, 31, 42, 48, 49]
    d2t, t2d = mapping.build_maps(sel, 50)
    assert t2d.sum() == 10 and mapping.coverage(counts, t2d) == 1.0


def test_frequency_ties_forced_and_mask():
    ids = np.array([7, 7, 7, 3, 3, 9, 9, 4, 1, 1, 1, 1])
    mask = np.array([1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0])  # id 1 only unsupervised: not counted
    counts = mapping.count_supervised(ids, mask, 12)
    assert counts[1] == 0 and counts[7] == 3
    # K=3, forced {11}: then 7 (x3), then 3 and 9 tie (x2) -> lower id 3
    sel = mapping.select_ids(counts, 3, forced=[11])
    assert sel.tolist() == [3, 7, 11]
    d2t, t2d = mapping.build_maps(sel, 12)
    assert mapping.coverage(counts, t2d) == pytest.approx(5 / 8)
    assert mapping.top_left_out(counts, t2d, 5) == [(9, 2), (4, 1)]
    with pytest.raises(ValueError, match="always-kept"):
        mapping.select_ids(counts, 1, forced=[0, 11])


def test_validate_rejects_bad_maps():
    with pytest.raises(ValueError, match="strictly increasing"):
        mapping.validate_maps(np.array([0, -1]), np.array([True, False, False]))
    with pytest.raises(ValueError, match=r"leaves \[0, 4\)"):
        mapping.validate_maps(np.array([0, 5]), np.zeros(4, dtype=bool))
    with pytest.raises(ValueError, match="t2d has 3 true entries"):
        mapping.validate_maps(np.array([0, 1]), np.array([True, False, True, True]))


def _fake_prepare(run_dir, rows, vocab_size):
    import datasets

    from specdraft.core.config import StageConfig
    from specdraft.core.manifest import StageClock, write_manifest

    class FakeStage(StageConfig):
        pass
    from specdraft.prepare.writer import features

    prep = run_dir / "prepare"
    ds = datasets.Dataset.from_dict({
        "input_ids": [r[0] for r in rows], "loss_mask": [r[1] for r in rows],
        "sample_id": [f"s{i}" for i in range(len(rows))], "turn_index": [0] * len(rows),
        "seq_len": [len(r[0]) for r in rows], "truncated": [False] * len(rows)},
        features=features())
    ds.save_to_disk(str(prep / "dataset"))
    write_manifest(prep, stage="prepare", config=FakeStage(), clock=StageClock(), extra={
        "verifier_vocab_size": vocab_size, "tokenizer": {"path": "none"}, "chat_format": {},
        "forced_token_ids": {"eos": [0], "stop": [2], "think": [], "template_special": [1, 2],
                             "byte_fallback": [60, 61]}})


def test_vocab_stage(tmp_path):
    from safetensors.numpy import load_file
    from typer.testing import CliRunner

    from specdraft.cli import app

    rows = [([1, 10, 20, 20, 30, 2], [0, 0, 1, 1, 1, 1]),
            ([1, 40, 20, 50, 50, 2], [0, 0, 1, 1, 1, 1])]
    _fake_prepare(tmp_path, rows, 64)
    res = CliRunner().invoke(app, ["vocab", "--run-dir", str(tmp_path), "--draft-vocab-size",
                                   "8", "--no-include-byte-fallback"])
    assert res.exit_code == 0, res.output
    maps = load_file(str(tmp_path / "vocab" / "vocab_map.safetensors"))
    assert maps["d2t"].dtype == np.int64 and maps["t2d"].dtype == bool
    assert maps["t2d"].shape == (64,)
    # forced 0, 1, 2; counts: 20 x3, 2 x2 (forced), 50 x2, 30 x1; 8 - 3 forced = 5 by frequency:
    # 20, 50, 30, then none left -> lowest unused ids 3, 4
    target = (np.arange(8) + maps["d2t"]).tolist()
    assert target == [0, 1, 2, 3, 4, 20, 30, 50]
    man = json.loads((tmp_path / "vocab" / "manifest.json").read_text())["vocab"]
    assert man["coverage"] == 1.0 and man["supervised_tokens"] == 8
    assert man["filled_unseen"] == 2 and man["top_left_out"] == []
    assert "coverage 100.00%" in res.output
    # K=5 with byte-fallback ids 60, 61 also forced: 0, 1, 2, 60, 61 fill K; only id 2 (x2)
    # of the supervised tokens is covered
    res = CliRunner().invoke(app, ["vocab", "--run-dir", str(tmp_path), "--draft-vocab-size",
                                   "5", "--overwrite"])
    man = json.loads((tmp_path / "vocab" / "manifest.json").read_text())["vocab"]
    assert res.exit_code == 0, res.output
    assert man["coverage"] == pytest.approx(2 / 8)
    assert [t["id"] for t in man["top_left_out"]] == [20, 50, 30]
