"""``benchmarks/bench_quality.py --ablation NAME``: every row of the DFlash / acceptance-term
ablation (docs/benchmarks.md "DFlash ablation (to run)") builds a pipeline config that
validates, differs from its baseline in exactly its own settings, and keeps today's defaults
in the baseline rows. Nothing is trained or run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_quality  # noqa: E402
from specdraft.pipeline.config import PipelineConfig  # noqa: E402


@pytest.mark.parametrize("name", sorted(bench_quality.ABLATIONS))
def test_each_ablation_row_is_a_valid_config(tmp_path, name):
    drafter, train, extract = bench_quality.ABLATIONS[name]
    cfg = bench_quality.ablation_config(tmp_path / "run", name)
    base = bench_quality.pipeline_yaml(tmp_path / "run", drafter=drafter)
    base["train"].update(bench_quality.ABLATION_BASE.get(drafter, {}))  # the pinned baseline
    changed = {k for k in cfg["train"] if cfg["train"][k] != base["train"].get(k)}
    assert changed == set(train)  # exactly its own train settings
    assert {k for k in cfg["extract"] if cfg["extract"][k] != base["extract"].get(k)} == \
        set(extract)
    path = tmp_path / "bench-quality.yaml"
    path.write_text(yaml.safe_dump(cfg))
    config = PipelineConfig.from_yaml(path)  # every field validates (names, values, kinds)
    stage = config.stages["train"]
    for key, value in train.items():
        assert getattr(stage, key) == value


def test_baseline_rows_keep_todays_defaults(tmp_path):
    """The ``dflash`` row is the DFlash of the 2026-12-04 tables: no new setting, and the
    slot weights pinned to ``exp`` though D-PACE is the default now."""
    from specdraft.train.config import TrainConfig

    cfg = bench_quality.ablation_config(tmp_path, "dflash")
    t = TrainConfig(run_dir=tmp_path, **cfg["train"])
    assert (t.dflash_anchor_draw, t.dflash_weights, t.dflash_labels, t.dflash_init_std,
            t.dflash_target_layers, t.loss_focal_weight, t.loss_expected_length_weight) == \
        ("replacement", "exp", "row", None, "extract", 0.0, 0.0)
    assert (t.dflash_anchors, t.grad_clip, t.beta2, t.min_lr_ratio) == (32, 0.5, 0.95, 0.1)


def test_spread_row_extracts_the_rule_layers():
    """SmolLM2-135M has 30 layers: the rule's [1, 27] + 1 are the row's aux layers."""
    from specdraft.models.dflash import spread_target_layer_ids

    layers = bench_quality.DRAFTERS["dflash"]["dflash_layers"]
    want = [i + 1 for i in spread_target_layer_ids(30, layers)]
    assert bench_quality.ABLATIONS["dflash-spread-layers"][2]["aux_layers"] == want


def test_set_items_are_parsed_or_refused():
    cfg = {"train": {}, "extract": {}}
    bench_quality.apply_sets(cfg, "extract", ["aux_layers=[2, 28]"])
    assert cfg["extract"]["aux_layers"] == [2, 28]
    with pytest.raises(ValueError, match="--train-set 'oops'"):
        bench_quality.apply_sets(cfg, "train", ["oops"])


def test_wallclock_epochs_by_hand():
    """2026-12-06's alone figures: specdraft 401.6 s for 2 epochs (200.8 s each), the peer
    972.1 s: 4 epochs fit (803 s), 5 would not (1004 s). A tie fits; a bad time is refused."""
    assert bench_quality.wallclock_epochs(2, 401.6, 972.1) == 4
    assert bench_quality.wallclock_epochs(2, 400.0, 1000.0) == 5  # exactly 5 x 200 s
    assert bench_quality.wallclock_epochs(3, 900.0, 250.0) == 0
    with pytest.raises(ValueError, match="positive"):
        bench_quality.wallclock_epochs(2, 0.0, 10.0)


def test_wallclock_steps_by_hand():
    """2026-12-06's alone figures: specdraft 401.6 s for 234 steps, the peer 972.1 s:
    972.1 * 234 / 401.6 = 566.4, so 566 steps fit (the 4 whole epochs are 468). A tie fits; a
    bad count is refused."""
    assert bench_quality.wallclock_steps(234, 401.6, 972.1) == 566
    assert bench_quality.wallclock_steps(100, 200.0, 300.0) == 150  # exactly 150 x 2 s
    with pytest.raises(ValueError, match="positive"):
        bench_quality.wallclock_steps(0, 10.0, 10.0)


@pytest.mark.parametrize("argv, message", [
    (["--peer", "--peer-train-only", "--until", "extract"],
     "--peer-train-only needs specdraft's train stage"),
    (["--peer-train-only"], "--peer-train-only needs --peer"),
    (["--until", "extrakt"], "--until extrakt: not a stage")])
def test_flag_combinations_refused_by_name(monkeypatch, capsys, tmp_path, argv, message):
    """Refused before anything runs (no run directory is written)."""
    monkeypatch.setattr("sys.argv", ["bench_quality.py", "--run-dir", str(tmp_path / "r"), *argv])
    with pytest.raises(SystemExit) as exc:
        bench_quality.main()
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
