"""``benchmarks/ablation_table.py``: each ablation row against its own drafter's baseline, the
Δτ by hand from the committed / verify counts, and a row without its baseline refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ablation_table  # noqa: E402
from test_quality_table import make_run  # noqa: E402


def test_each_row_against_its_own_baseline(tmp_path):
    # 4 prompts x 10 verify steps: tau = sum(committed) / 40
    base = make_run(tmp_path, "dflash", [20, 20, 20, 20])          # tau 2.0
    dpace = make_run(tmp_path, "dflash-dpace", [22, 22, 22, 22])   # tau 2.2: +0.2 everywhere
    e31 = make_run(tmp_path, "eagle3.1", [30, 30, 30, 30])         # tau 3.0
    focal = make_run(tmp_path, "eagle3.1-focal", [27, 27, 27, 27])  # tau 2.7: -0.3
    s1 = make_run(tmp_path, "dflash-s1", [21, 21, 21, 21], seed=1)
    m = json.loads((dpace / "train" / "manifest.json").read_text())
    m["verifier_argmax_differs"] = {"positions": 100, "differ": 7, "fraction": 0.07}
    (dpace / "train" / "manifest.json").write_text(json.dumps(m))
    out = ablation_table.table([base, dpace, e31, focal], seeds=[base, s1]).splitlines()
    rows = {line.split(" | ")[0].strip("| "): line for line in out if line.startswith("| ")}
    assert "| +0.200 [+0.200, +0.200] | 1.100 [1.100, 1.100] | 12 | 0.0700 |" in rows["dflash-dpace"]
    assert "dflash_weights=dpace" in rows["dflash-dpace"]
    assert "| -0.300 [-0.300, -0.300] | 0.900 [0.900, 0.900] |" in rows["eagle3.1-focal"]
    assert "| — | — |" in rows["dflash"] and "| — | — |" in rows["eagle3.1"]
    assert out[-1].endswith("2.000, 2.100 (spread 0.100)")
    assert ablation_table.baseline_of("dflash-labels-soft-s2") == "dflash-s2"
    with pytest.raises(ValueError, match="baseline eagle3.1 is not among"):
        ablation_table.table([base, focal])


def test_a_row_over_seeds_against_the_baseline_of_each_seed(tmp_path):
    runs = [make_run(tmp_path, "dflash", [20] * 4),                     # 2.0
            make_run(tmp_path, "dflash-s1", [24] * 4, seed=1),          # 2.4
            make_run(tmp_path, "dflash-dpace", [22] * 4),               # 2.2: +0.2
            make_run(tmp_path, "dflash-dpace-s1", [23] * 4, seed=1)]    # 2.3: -0.1 vs 2.4
    out = ablation_table.table(runs).splitlines()
    assert out[-1] == "dflash-dpace: Δτ per seed +0.200 (dflash-dpace), -0.100 " \
                      "(dflash-dpace-s1); mean +0.050"


def test_a_seed_row_without_its_seeds_baseline_is_shown_without_delta(tmp_path):
    runs = [make_run(tmp_path, "dflash", [20] * 4),
            make_run(tmp_path, "dflash-dpace-s2", [22] * 4, seed=2)]
    row = [line for line in ablation_table.table(runs).splitlines() if "dpace-s2" in line][0]
    assert "| no dflash-s2 | no dflash-s2 |" in row


def test_a_row_on_top_of_another_is_paired_with_its_parent(tmp_path):
    """``eagle3.1-lr1e3-sw1`` = lr 1e-3 + step weight 1: against ``eagle3.1-lr1e3`` of the same
    seed, its settings column only the change."""
    runs = [make_run(tmp_path, "eagle3.1", [20] * 4),                  # 2.0
            make_run(tmp_path, "eagle3.1-lr1e3", [24] * 4),            # 2.4
            make_run(tmp_path, "eagle3.1-lr1e3-sw1", [25] * 4)]        # 2.5: +0.1 vs 2.4
    rows = {line.split(" | ")[0].strip("| "): line
            for line in ablation_table.table(runs).splitlines() if line.startswith("| ")}
    assert "| step_weight=1.0 | 2.500 [" in rows["eagle3.1-lr1e3-sw1"]
    assert "| +0.100 [+0.100, +0.100] |" in rows["eagle3.1-lr1e3-sw1"]
    assert ablation_table.baseline_of("eagle3.1-lr1e3-sw1-s2") == "eagle3.1-lr1e3-s2"
    with pytest.raises(ValueError, match="baseline eagle3.1-lr1e3 is not among"):
        ablation_table.table([runs[0], runs[2]])


def test_every_parent_row_is_its_child_less_one_change():
    from bench_quality import ABLATION_PARENTS, ABLATIONS

    for child, parent in ABLATION_PARENTS.items():
        (cd, ct, ce), (pd, pt, pe) = ABLATIONS[child], ABLATIONS[parent]
        assert cd == pd, child
        assert {**pt, **pe}.items() <= {**ct, **ce}.items(), child   # the parent's settings kept
        assert len({**ct, **ce}) == len({**pt, **pe}) + 1, child      # and one change more
