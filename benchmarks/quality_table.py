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
adds that peer as a row (the first ``--peer`` stays the reference; ``--peer NAME=DIR`` names
the row, e.g. the same kind trained at another lr). ``--pair A B``: also
row A's ratio to row B (e.g. ``--pair dflash spec:dflash``: each trainer's DFlash).

The headline comparison as JSON (``--headline NAME A B``, NAME one of :data:`HEADLINES`; A and
B row names, or comma-separated lists of them, one pair per training seed), written to
``--json`` (default ``docs/quality-latest.json``) with the date, the commit and the seeds::

    python benchmarks/quality_table.py B/eagle3 B/dflash B/e31-3ep --peer B/eagle3 \
        --peer B/dflash/peer-dflash \
        --headline dflash_vs_peer_dflash_equal_epochs dflash spec:dflash \
        --headline best_vs_peer_best_equal_wallclock e31-3ep spec:dflash \
        --note best_vs_peer_best_equal_wallclock "how the budget was measured" --note size "..."

``--note KEY TEXT`` puts TEXT in the JSON: in headline KEY, or at the top level under KEY.
``--keep NAME`` carries headline NAME unchanged from the file already there (its own date and
commit): re-measure one comparison after the other's run directories are gone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
from pathlib import Path
from typing import Any

from specdraft.eval.compare import tau_ratio_ci

#: set -> (its eval directory in a run, in a peer directory)
SETS = {"gsm8k": ("eval", "eval-gsm8k"), "mt": ("eval-mtbench", "eval-mtbench")}
#: the comparisons ``--headline`` may name (issue 37's goal, docs/benchmarks.md)
HEADLINES = ("dflash_vs_peer_dflash_equal_epochs", "best_vs_peer_best_equal_wallclock")
REPO = Path(__file__).resolve().parents[1]


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def peer_name(arg: str) -> tuple[str, Path]:
    """``--peer`` value -> (row name, directory): ``NAME=DIR`` names the row ``NAME`` (two
    peers of one kind, e.g. at two learning rates); a bare ``DIR`` is ``speculators`` for a
    run's ``peer/`` and ``spec:KIND`` for a ``peer-KIND/`` directory."""
    name, sep, path = arg.partition("=")
    named = bool(sep and name and "/" not in name)
    pdir = Path(path if named else arg)
    pdir = pdir / "peer" if (pdir / "peer" / "trained.json").exists() else pdir
    if named:
        return name, pdir
    return ("speculators" if pdir.name == "peer" else
            f"spec:{pdir.name.removeprefix('peer-')}"), pdir


def collect(runs: list[Path], peers: list[str]) -> tuple[dict, dict, dict]:
    """(rows: name -> {set: results.json path}, train seconds by name, seeds by name: the
    ``seed`` of a specdraft run's train config, None for a peer). ``peers``: ``--peer``
    values (:func:`peer_name`). ValueError when two rows get one name."""
    rows = {r.name: {s: r / d[0] / "results.json" for s, d in SETS.items()} for r in runs}
    if len(rows) < len(runs):
        raise ValueError(f"two runs share a name: {sorted(r.name for r in runs)}")
    seconds, seeds = {}, {}
    for r in runs:
        manifest = load(r / "train" / "manifest.json")
        seconds[r.name] = manifest["elapsed_s"]
        seeds[r.name] = (manifest.get("config") or {}).get("seed")
    for peer in peers:
        name, pdir = peer_name(str(peer))
        if name in rows:
            raise ValueError(f"--peer {peer}: the row name {name} is taken; name it: "
                             f"--peer NAME={pdir}")
        rows[name] = {s: pdir / d[1] / "results.json" for s, d in SETS.items()}
        seconds[name], seeds[name] = load(pdir / "trained.json")["seconds"], None
    return rows, seconds, seeds


def headline(rows: dict, name: str, a: str, b: str, seeds: dict) -> dict[str, Any]:
    """One headline comparison: rows ``a`` over rows ``b`` (comma-separated, one pair per
    seed). Per set measured for every pair: each pair's paired-bootstrap ratio and interval
    (``per_seed``), and over the pairs ``ratio`` = their mean, ``lo`` = the lowest ``lo``,
    ``hi`` = the highest ``hi`` (one pair: its own), ``spread`` = the ratios' max - min. The
    top-level ``ratio``, ``lo``, ``hi`` are GSM8K's. Raises ValueError naming an unknown row
    or unequal lists."""
    xs, ys = a.split(","), b.split(",")
    if len(xs) != len(ys) and len(ys) != 1:
        raise ValueError(f"--headline {name}: {len(xs)} rows over {len(ys)}: give one peer row "
                         f"or one per seed")
    ys = ys * len(xs) if len(ys) == 1 else ys
    unknown = [r for r in xs + ys if r not in rows]
    if unknown:
        raise ValueError(f"--headline {name}: no row {unknown} (rows: {sorted(rows)})")
    out: dict[str, Any] = {"drafter": xs, "peer": ys, "seeds": [seeds.get(x) for x in xs],
                           "by_set": {}}
    for s in SETS:
        if not all(rows[r][s].exists() for r in xs + ys):
            continue
        per = []
        for x, y in zip(xs, ys):
            ci = tau_ratio_ci(load(rows[x][s]), load(rows[y][s]))
            per.append({"drafter": x, "peer": y, "seed": seeds.get(x), "ratio": ci.ratio,
                        "lo": ci.low, "hi": ci.high, "prompts": ci.prompts})
        ratios = [p["ratio"] for p in per]
        out["by_set"][s] = {"ratio": sum(ratios) / len(ratios),
                            "lo": min(p["lo"] for p in per), "hi": max(p["hi"] for p in per),
                            "spread": max(ratios) - min(ratios), "per_seed": per}
    top = out["by_set"].get("gsm8k", {})
    out.update(ratio=top.get("ratio"), lo=top.get("lo"), hi=top.get("hi"))
    return out


def git_commit() -> str:
    """The repository's HEAD commit ("unknown" outside a git checkout)."""
    res = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                         text=True)
    return res.stdout.strip() if res.returncode == 0 else "unknown"


def write_json(path: Path, heads: dict[str, dict], *, commit: str | None = None,
               date: str | None = None, notes: dict[str, str] | None = None,
               keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """Write the headline comparisons to ``path`` (``{"date", "commit", "seeds", NAME: ...}``,
    ``seeds`` the sorted training seeds of every headline's drafter rows; ``notes``: more
    top-level keys, e.g. ``size``); returns it. Each headline carries the ``date`` and
    ``commit`` it was measured at. ``keep``: headline names carried unchanged from the file
    already at ``path`` (with its other top-level keys, unless ``notes`` gives them), so one
    comparison can be re-measured while the other's run directories are gone; a kept
    headline written before headlines had their own date takes the old file's. ValueError
    when a kept name is missing there or is also in ``heads``."""
    date = date or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    commit = commit or git_commit()
    heads = {n: {**h, "date": date, "commit": commit} for n, h in heads.items()}
    extra: dict[str, Any] = {}
    if keep:
        old = json.loads(path.read_text()) if path.exists() else {}
        for name in keep:
            if name in heads or name not in old:
                raise ValueError(f"--keep {name}: " + ("also a --headline of this call"
                                 if name in heads else f"not in {path}"))
            heads[name] = {"date": old.get("date"), "commit": old.get("commit"), **old[name]}
        extra = {k: v for k, v in old.items()
                 if k not in HEADLINES and k not in ("date", "commit", "seeds")}
    seeds = sorted({s for h in heads.values() for s in h["seeds"] if s is not None})
    doc = {"date": date, "commit": commit, "seeds": seeds,
           **heads, **extra, **(notes or {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def print_table(rows: dict, seconds: dict, refs: list[str], pairs: list) -> None:
    """The table of docs/benchmarks.md: per set, each row's τ, per-position rates, its ratio to
    each reference and its train seconds; then each ``--pair``."""
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
        for x, y in pairs:
            ci = tau_ratio_ci(load(rows[x][s]), load(rows[y][s]))
            print(f"  {x} / {y}: {ci.ratio:.3f} [{ci.low:.3f}, {ci.high:.3f}]")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--peer", action="append", default=[], metavar="[NAME=]DIR",
                    help="a peer's row: RUN (its peer/), or a peer-KIND directory (row "
                    "spec:KIND); NAME=DIR names the row (two peers of one kind)")
    ap.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"))
    ap.add_argument("--headline", nargs=3, action="append", default=[],
                    metavar=("NAME", "A", "B"), help=f"a headline comparison for the JSON: "
                    f"NAME in {', '.join(HEADLINES)}; A, B row names (comma-separated: one "
                    f"pair per seed)")
    ap.add_argument("--note", nargs=2, action="append", default=[], metavar=("KEY", "TEXT"),
                    help="a note in the JSON: KEY a --headline NAME (the note goes in that "
                    "comparison) or a top-level key (e.g. size)")
    ap.add_argument("--keep", action="append", default=[], metavar="NAME",
                    help="carry headline NAME unchanged (its date and commit) from the "
                    "existing --json file")
    ap.add_argument("--json", type=Path, default=REPO / "docs" / "quality-latest.json",
                    help="where --headline writes (default docs/quality-latest.json)")
    a = ap.parse_args(argv)
    for name, _, _ in a.headline:
        if name not in HEADLINES:
            ap.error(f"--headline {name}: not one of {', '.join(HEADLINES)}")
    try:
        rows, seconds, seeds = collect(a.runs, a.peer)
    except ValueError as err:
        ap.error(str(err))
    refs = [a.runs[0].name] + ([n for n in rows if n.startswith("spec")][:1] if a.peer else [])
    print_table(rows, seconds, refs, a.pair)
    if a.headline:
        try:
            heads = {name: headline(rows, name, x, y, seeds) for name, x, y in a.headline}
        except ValueError as err:
            ap.error(str(err))
        top = {}
        for key, text in a.note:
            if key in heads:
                heads[key]["note"] = text
            elif key in HEADLINES or key in ("date", "commit", "seeds"):
                ap.error(f"--note {key}: not a --headline of this call, nor a free key")
            else:
                top[key] = text
        try:
            write_json(a.json, heads, notes=top, keep=tuple(a.keep))
        except ValueError as err:
            ap.error(str(err))
        print(f"\nheadline -> {a.json}")


if __name__ == "__main__":
    main()
