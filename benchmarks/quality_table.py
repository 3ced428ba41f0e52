"""The drafter comparison table of docs/benchmarks.md from ``bench_quality.py`` run directories.

    python benchmarks/quality_table.py B/eagle3 B/eagle3.1 B/qwen3 B/dflash [--peer B/eagle3] \
        [--peer B/eagle3/peer-eagle3-defaults --peer B/dflash/peer-dflash]

The first directory is the reference. For each run: τ and per-position acceptance on GSM8K
test (``RUN/eval``) and MT-bench (``RUN/eval-mtbench``), train seconds, and τ's ratio to the
reference's with its paired 95 % bootstrap interval over prompts
(:func:`specdraft.eval.compare.tau_ratio_ci`); a set some run has no results for is named and
skipped. ``--peer RUN``: also speculators' drafter of
``RUN/peer`` (``bench_quality.py --peer``), as a row and as the reference of a second ratio;
``--peer DIR`` again, with DIR a peer directory (``RUN/peer-dflash``, ...: ``--peer-kind``),
adds that peer as a row (the first ``--peer`` stays the reference). ``--pair A B``: also
row A's ratio to row B (e.g. ``--pair dflash spec:dflash``: each trainer's DFlash).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdraft.eval.compare import tau_ratio_ci

#: set -> (its eval directory in a run, in a peer directory)
SETS = {"gsm8k": ("eval", "eval-gsm8k"), "mt": ("eval-mtbench", "eval-mtbench")}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--peer", type=Path, action="append", default=[])
    ap.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"))
    a = ap.parse_args()
    rows = {r.name: {s: r / d[0] / "results.json" for s, d in SETS.items()} for r in a.runs}
    seconds = {r.name: load(r / "train" / "manifest.json")["elapsed_s"] for r in a.runs}
    for peer in a.peer:
        pdir = peer / "peer" if (peer / "peer" / "trained.json").exists() else peer
        name = "speculators" if pdir.name == "peer" else f"spec:{pdir.name.removeprefix('peer-')}"
        rows[name] = {s: pdir / d[1] / "results.json" for s, d in SETS.items()}
        seconds[name] = load(pdir / "trained.json")["seconds"]
    refs = [a.runs[0].name] + ([n for n in rows if n.startswith("spec")][:1] if a.peer else [])
    for s in SETS:
        missing = [n for n, files in rows.items() if not files[s].exists()]
        if missing:
            print(f"\n{s}: not measured for {missing} (no {SETS[s][0]}/results.json)")
            continue
        print(f"\n{s}: tau [per position]   " + "   ".join(f"ratio to {r}" for r in refs)
              + "   train s")
        for name, files in rows.items():
            res = load(files[s])
            pos = ", ".join(f"{p:.3f}" for p in res["per_position"])
            ratios = []
            for ref in refs:
                ci = tau_ratio_ci(res, load(rows[ref][s]))
                ratios.append(f"{ci.ratio:.3f} [{ci.low:.3f}, {ci.high:.3f}]")
            print(f"  {name:<22} {res['tau']:.3f} [{pos}]   " + "   ".join(ratios)
                  + f"   {seconds[name]:.0f}")
        for x, y in a.pair:
            ci = tau_ratio_ci(load(rows[x][s]), load(rows[y][s]))
            print(f"  {x} / {y}: {ci.ratio:.3f} [{ci.low:.3f}, {ci.high:.3f}]")


if __name__ == "__main__":
    main()
