"""The ablation table of docs/benchmarks.md ("DFlash ablation") from ``bench_quality.py
--ablation NAME`` run directories: each row against its own baseline on the same prompts.

    python benchmarks/ablation_table.py B/dflash B/dflash-distinct32 ... B/eagle3.1 \
        B/eagle3.1-focal ... [--set gsm8k] [--seeds B/dflash-s1,B/dflash-s2]

A row's baseline is the run named after its drafter (``dflash`` for every ``dflash-*`` row,
``eagle3.1`` for ``eagle3.1-*``; :data:`bench_quality.ABLATIONS`), or its parent row where
:data:`bench_quality.ABLATION_PARENTS` names one (a change on top of another), trained on the same
generate..extract with the same seed. Per row, on GSM8K test (``RUN/eval/results.json``): τ and
per-position acceptance, Δτ = τ_row − τ_baseline and τ's ratio, each with its paired 95 %
bootstrap interval over prompts (:func:`specdraft.eval.compare.tau_delta_ci`), the train stage's
seconds and, for DFlash, how often the verifier's argmax differs from the row's token
(``verifier_argmax_differs`` of the train manifest). The intervals say what another draw of
prompts could give, not another training seed: ``--seeds`` lists the baseline trained again
with other seeds (comma-separated run directories), and their τ spread is printed as the
training noise to read every Δτ against, and a row trained with several seeds gets its Δτ per
seed, each against the baseline of the same seed, and their mean. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specdraft.eval.compare import tau_delta_ci, tau_ratio_ci

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quality import ABLATION_PARENTS, ABLATIONS  # noqa: E402

SETS = {"gsm8k": "eval", "mt": "eval-mtbench"}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def split_seed(name: str) -> tuple[str, str]:
    """``("dflash-dpace", "1")`` for ``dflash-dpace-s1``; ``(name, "")`` without a seed suffix."""
    return (name[:-3], name[-1]) if name[-3:-1] == "-s" else (name, "")


def baseline_of(name: str) -> str:
    """The baseline row of ablation row ``name``: its parent row
    (:data:`bench_quality.ABLATION_PARENTS`) or else its drafter's own row (``dflash``,
    ``eagle3.1``); a seed suffix ``-sN`` carries over. ValueError for an unknown name."""
    base, seed = split_seed(name)
    if base not in ABLATIONS and base != "eagle3.1":
        raise ValueError(f"{name}: not an ablation row (bench_quality.ABLATIONS) or eagle3.1")
    parent = ABLATION_PARENTS.get(base) or (ABLATIONS[base][0] if base in ABLATIONS
                                            else "eagle3.1")
    return parent + (f"-s{seed}" if seed else "")


def settings(name: str) -> str:
    base = split_seed(name)[0]
    if base not in ABLATIONS:
        return "baseline"
    _, train, extract = ABLATIONS[base]
    own = {**train, **extract}
    parent = ABLATION_PARENTS.get(base)
    if parent:  # only the change on top of the parent
        inherited = {**ABLATIONS[parent][1], **ABLATIONS[parent][2]}
        own = {k: v for k, v in own.items() if k not in inherited or inherited[k] != v}
    return ", ".join(f"{k}={v}" for k, v in own.items()) or "baseline"


def table(runs: list[Path], set_name: str = "gsm8k", seeds: list[Path] | None = None) -> str:
    """The markdown table (module docstring). ValueError naming a row whose baseline is not
    among ``runs`` (a seed row ``NAME-sN`` without ``BASELINE-sN`` is shown without Δτ)."""
    by_name = {r.name: r for r in runs}
    sub = SETS[set_name]
    lines = ["| row | settings | τ [per position] | Δτ vs baseline [95 %] | ratio [95 %] | "
             "train s | argmax ≠ row token |", "|---|---|---|---|---|---|---|"]
    for run in runs:
        res = load(run / sub / "results.json")
        base = baseline_of(run.name)
        if base not in by_name and not split_seed(base)[1]:
            raise ValueError(f"{run}: its baseline {base} is not among the runs")
        pos = ", ".join(f"{p:.3f}" for p in res["per_position"])
        if base == run.name or base not in by_name:  # a baseline, or a seed with none of its own
            delta = ratio = "—" if base == run.name else f"no {base}"
        else:
            ref = load(by_name[base] / sub / "results.json")
            d, r = tau_delta_ci(res, ref), tau_ratio_ci(res, ref)
            delta = f"{d.delta:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
            ratio = f"{r.ratio:.3f} [{r.low:.3f}, {r.high:.3f}]"
        manifest = load(run / "train" / "manifest.json")
        differs = manifest.get("verifier_argmax_differs")
        frac = f"{differs['fraction']:.4f}" if isinstance(differs, dict) and \
            "fraction" in differs else "—"
        lines.append(f"| {run.name} | {settings(run.name)} | {res['tau']:.3f} [{pos}] | "
                     f"{delta} | {ratio} | {manifest['elapsed_s']:.0f} | {frac} |")
    lines += seed_lines(runs, sub)
    if seeds:
        taus = [load(r / sub / "results.json")["tau"] for r in seeds]
        lines.append("")
        lines.append(f"training noise: τ of the baseline over seeds "
                     f"{', '.join(f'{t:.3f}' for t in taus)} (spread {max(taus) - min(taus):.3f})")
    return "\n".join(lines)


def seed_lines(runs: list[Path], sub: str) -> list[str]:
    """For each row trained with two or more seeds (``NAME``, ``NAME-s1``, ...) whose baseline
    has the same seeds among ``runs``: Δτ per seed, each against the baseline of that seed, and
    their mean. Training noise moves τ as much as many settings do at small sizes, so a
    setting's effect is read from these, not from one seed's interval over prompts."""
    by_name = {r.name: r for r in runs}
    groups: dict[str, list[str]] = {}
    for name in by_name:
        groups.setdefault(split_seed(name)[0], []).append(name)
    out = []
    for row, names in groups.items():
        pairs = [(n, baseline_of(n)) for n in sorted(names)]
        pairs = [(n, b) for n, b in pairs if b in by_name and b != n]
        if len(pairs) < 2:
            continue
        deltas = [load(by_name[n] / sub / "results.json")["tau"]
                  - load(by_name[b] / sub / "results.json")["tau"] for n, b in pairs]
        per = ", ".join(f"{d:+.3f} ({n})" for d, (n, _) in zip(deltas, pairs))
        out.append(f"{row}: Δτ per seed {per}; mean {sum(deltas) / len(deltas):+.3f}")
    return [""] + out if out else []


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--set", default="gsm8k", choices=sorted(SETS))
    ap.add_argument("--seeds", default="", help="the baseline's other-seed runs, "
                    "comma-separated (their τ spread is printed)")
    a = ap.parse_args(argv)
    seeds = [Path(p) for p in a.seeds.split(",") if p]
    try:
        print(table(a.runs, a.set, seeds))
    except ValueError as err:
        ap.error(str(err))


if __name__ == "__main__":
    main()
