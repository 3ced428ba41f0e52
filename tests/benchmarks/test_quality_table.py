"""``benchmarks/quality_table.py --headline``: docs/quality-latest.json from tiny synthetic run
directories (4 prompts per set), each ratio checked against the committed/verify counts by
hand; over two seeds the mean ratio and the envelope of the intervals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import quality_table  # noqa: E402


def results(committed: list[int], steps: list[int]) -> dict:
    tau = sum(committed) / sum(steps)
    return {"tau": tau, "per_position": [0.5, 0.25],
            "prompts": [{"id": f"p{i}", "committed": c, "verify_steps": s}
                        for i, (c, s) in enumerate(zip(committed, steps))]}


def make_run(root: Path, name: str, committed: list[int], *, seed: int = 0) -> Path:
    run = root / name
    for d in ("eval", "eval-mtbench"):
        (run / d).mkdir(parents=True)
        (run / d / "results.json").write_text(json.dumps(results(committed, [10] * 4)))
    (run / "train").mkdir()
    (run / "train" / "manifest.json").write_text(json.dumps(
        {"elapsed_s": 12.0, "config": {"seed": seed}}))
    return run


def make_peer(root: Path, name: str, committed: list[int]) -> Path:
    pdir = root / "base" / f"peer-{name}"
    for d in ("eval-gsm8k", "eval-mtbench"):
        (pdir / d).mkdir(parents=True)
        (pdir / d / "results.json").write_text(json.dumps(results(committed, [10] * 4)))
    (pdir / "trained.json").write_text(json.dumps({"seconds": 30.0}))
    return pdir


def test_headline_json_by_hand(tmp_path, capsys):
    """τ = committed / verify steps (40 steps each): dflash 15+15+15+15 = 60 / 40 = 1.5, the
    peer's DFlash 12 * 4 = 48 / 40 = 1.2: ratio 1.25; every prompt has the same ratio, so the
    paired interval is the point. best: 20 * 4 / 48 = 1.6667."""
    dflash = make_run(tmp_path, "dflash", [15, 15, 15, 15], seed=1)
    best = make_run(tmp_path, "e31-3ep", [20, 20, 20, 20], seed=1)
    peer = make_peer(tmp_path, "dflash", [12, 12, 12, 12])
    out = tmp_path / "docs" / "quality-latest.json"
    quality_table.main([str(dflash), str(best), "--peer", str(peer),
                        "--headline", "dflash_vs_peer_dflash_equal_epochs", "dflash",
                        "spec:dflash",
                        "--headline", "best_vs_peer_best_equal_wallclock", "e31-3ep",
                        "spec:dflash", "--json", str(out),
                        "--note", "best_vs_peer_best_equal_wallclock", "4 epochs for 2",
                        "--note", "size", "full"])
    doc = json.loads(out.read_text())
    assert set(doc) == {"date", "commit", "seeds", "dflash_vs_peer_dflash_equal_epochs",
                        "best_vs_peer_best_equal_wallclock", "size"}
    assert doc["size"] == "full"
    assert doc["best_vs_peer_best_equal_wallclock"]["note"] == "4 epochs for 2"
    assert "note" not in doc["dflash_vs_peer_dflash_equal_epochs"]
    assert doc["seeds"] == [1] and len(doc["date"]) == 10
    d = doc["dflash_vs_peer_dflash_equal_epochs"]
    assert d["drafter"] == ["dflash"] and d["peer"] == ["spec:dflash"]
    assert (d["ratio"], d["lo"], d["hi"]) == pytest.approx((1.25, 1.25, 1.25))
    b = doc["best_vs_peer_best_equal_wallclock"]
    assert b["ratio"] == pytest.approx(80 / 48) and b["by_set"]["mt"]["ratio"] == \
        pytest.approx(80 / 48)
    assert "headline ->" in capsys.readouterr().out


def test_headline_over_seeds_mean_and_envelope(tmp_path):
    """Two seeds: ratios 1.5/1.2 = 1.25 and 1.2/1.2 = 1.0 (prompt-level spread in the
    second, so its interval is wide): mean 1.125, lo = the lower of the lows, spread 0.25."""
    runs = [make_run(tmp_path, "d0", [15, 15, 15, 15], seed=0),
            make_run(tmp_path, "d1", [6, 18, 6, 18], seed=1)]
    peer = make_peer(tmp_path, "dflash", [12, 12, 12, 12])
    rows, _, seeds = quality_table.collect(runs, [peer])
    h = quality_table.headline(rows, "dflash_vs_peer_dflash_equal_epochs", "d0,d1",
                               "spec:dflash", seeds)
    g = h["by_set"]["gsm8k"]
    assert [p["ratio"] for p in g["per_seed"]] == pytest.approx([1.25, 1.0])
    assert g["ratio"] == pytest.approx(1.125) and g["spread"] == pytest.approx(0.25)
    assert g["lo"] == min(p["lo"] for p in g["per_seed"]) < 1.0 < g["hi"]
    assert h["seeds"] == [0, 1] and h["ratio"] == g["ratio"]
    doc = quality_table.write_json(tmp_path / "q.json", {"x": h}, commit="abc", date="2026-12-05")
    assert doc["seeds"] == [0, 1] and doc["commit"] == "abc"


def test_unknown_row_or_name_is_refused(tmp_path):
    run = make_run(tmp_path, "dflash", [15, 15, 15, 15])
    with pytest.raises(SystemExit):
        quality_table.main([str(run), "--headline", "dflash_vs_peer_dflash_equal_epochs",
                            "dflash", "spec:nothing", "--json", str(tmp_path / "q.json")])
    with pytest.raises(SystemExit):
        quality_table.main([str(run), "--headline", "not_a_headline", "dflash", "dflash",
                            "--json", str(tmp_path / "q.json")])
    with pytest.raises(SystemExit):  # a note on a headline this call does not write
        quality_table.main([str(run), "--headline", "dflash_vs_peer_dflash_equal_epochs",
                            "dflash", "dflash", "--note", "best_vs_peer_best_equal_wallclock",
                            "x", "--json", str(tmp_path / "q.json")])
    assert not (tmp_path / "q.json").exists()


def test_two_peers_of_one_kind_need_names(tmp_path):
    """The same kind trained at two learning rates: unnamed, the second takes the first's row
    name and is refused; named (``NAME=DIR``), each is its own row. By hand: 20 * 4 / 40 = 2.0
    over the peers' 1.2 (12 * 4 / 40) and 1.6 (16 * 4 / 40): 1.6667 and 1.25."""
    best = make_run(tmp_path, "e31", [20, 20, 20, 20])
    slow = make_peer(tmp_path / "a", "eagle3-defaults", [12, 12, 12, 12])
    fast = make_peer(tmp_path / "b", "eagle3-defaults", [16, 16, 16, 16])
    with pytest.raises(ValueError, match="spec:eagle3-defaults is taken"):
        quality_table.collect([best], [slow, fast])
    rows, _, seeds = quality_table.collect([best], [slow, f"spec:eagle3-lr1e3={fast}"])
    assert set(rows) == {"e31", "spec:eagle3-defaults", "spec:eagle3-lr1e3"}
    for peer, want in (("spec:eagle3-defaults", 2.0 / 1.2), ("spec:eagle3-lr1e3", 1.25)):
        h = quality_table.headline(rows, "best_vs_peer_best_equal_wallclock", "e31", peer, seeds)
        assert h["ratio"] == pytest.approx(want)


def test_keep_carries_a_headline_unchanged(tmp_path):
    """Re-measure one headline while the other's run directories are gone: ``--keep`` carries
    the other from the file already there, with the date and commit it was measured at (the
    old file's top level, for a file written before headlines had their own), and its other
    top-level keys; the new one gets today's. A kept name that is missing there or is also a
    ``--headline`` of the call is refused and the file is left as it was."""
    dflash = make_run(tmp_path, "dflash", [15, 15, 15, 15], seed=0)
    best = make_run(tmp_path, "e31", [20, 20, 20, 20], seed=2)
    peer = make_peer(tmp_path, "dflash", [12, 12, 12, 12])
    out = tmp_path / "q.json"
    rows, _, seeds = quality_table.collect([dflash], [peer])
    old = quality_table.headline(rows, "dflash_vs_peer_dflash_equal_epochs", "dflash",
                                 "spec:dflash", seeds)
    out.write_text(json.dumps({"date": "2026-12-05", "commit": "old", "seeds": [0],
                               "dflash_vs_peer_dflash_equal_epochs": old, "size": "full"}))
    before = out.read_text()
    for bad in ("best_vs_peer_best_equal_wallclock", "not_there"):
        with pytest.raises(SystemExit):
            quality_table.main([str(best), "--peer", str(peer), "--headline",
                                "best_vs_peer_best_equal_wallclock", "e31", "spec:dflash",
                                "--keep", bad, "--json", str(out)])
        assert out.read_text() == before
    quality_table.main([str(best), "--peer", str(peer), "--headline",
                        "best_vs_peer_best_equal_wallclock", "e31", "spec:dflash",
                        "--keep", "dflash_vs_peer_dflash_equal_epochs", "--json", str(out)])
    doc = json.loads(out.read_text())
    kept = doc["dflash_vs_peer_dflash_equal_epochs"]
    assert {k: v for k, v in kept.items() if k not in ("date", "commit")} == \
        json.loads(json.dumps(old))
    assert (kept["date"], kept["commit"]) == ("2026-12-05", "old")
    new = doc["best_vs_peer_best_equal_wallclock"]
    assert new["ratio"] == pytest.approx(80 / 48)  # 20 * 4 / 40 over 12 * 4 / 40
    assert (new["date"], new["commit"]) == (doc["date"], doc["commit"]) != ("2026-12-05", "old")
    assert doc["seeds"] == [0, 2] and doc["size"] == "full"
