"""Seconds per optimizer step of train settings on a run's own stored rows, side by side.

`bench_train.py` times a random drafter on random rows; what a setting such as `align_topk`
saves depends on how often the drafter is right, so this one times the real thing: a finished
train stage's settings (its `manifest.json`), its drafter's weights (optional: `--drafter`),
the run's rows and hidden states, and one or more variants of those settings, each a full
`specdraft train` setup (the stage's own `Trainer`) in a scratch run directory that links the
run's generate..extract. The teacher's full-vocabulary argmax is cached before timing (the cost
of every epoch after the first); the variants take turns, `--rounds` times, over the same
micro-batches, so the machine's drift falls on all of them alike.

    python benchmarks/bench_train_rows.py --train B/e31fz-s0/train \\
        --drafter B/e31fz-s0/train/last --set lm_head_init=verifier \\
        --variant "" --variant align_topk=1 --variant lm_head_init=verifier-frozen,align_topk=1

Prints one JSON line per variant (median seconds per step over its rounds, the range, the
training-set acc/cond_acc/τ̂ of its steps) and the ratio of each to the first variant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml


def parse_sets(text: str) -> dict:
    """``"k=v,k2=v2"`` (YAML values) -> dict; ``""`` -> {}. ValueError on an item without =."""
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{item!r}: expected KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    return out


def build_trainer(settings: dict, run_dir: Path, drafter: Path | None):
    """The train stage's ``Trainer`` for ``settings`` over ``run_dir`` (fit replaced: nothing
    is trained), its drafter loaded from ``drafter`` when given."""
    from safetensors.torch import load_file

    from specdraft.train import run as train_run
    from specdraft.train.config import TrainConfig

    built = []

    class Built(Exception):
        pass

    def keep(tr, resume=False):  # the stage stops here: no step, no manifest
        built.append(tr)
        raise Built

    real_fit, train_run.fit = train_run.fit, keep
    try:
        train_run.run(TrainConfig(**{**settings, "run_dir": str(run_dir), "overwrite": True,
                                     "resume": False, "teacher_check": False}))
    except Built:
        pass
    finally:
        train_run.fit = real_fit
    tr = built[0]
    if drafter is not None:
        state = load_file(str(drafter / "drafter.safetensors"))
        missing = tr.objective.drafter.load_state_dict(state, strict=False).missing_keys
        if [k for k in missing if not k.startswith("rotary.")]:
            raise SystemExit(f"{drafter}: the drafter lacks {missing[:4]}")
    return tr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=Path, required=True, help="a finished RUN/train directory "
                    "(its manifest's settings; RUN's generate..extract are read)")
    ap.add_argument("--drafter", type=Path, default=None, help="a saved drafter directory "
                    "(RUN/train/last) whose weights every variant starts from")
    ap.add_argument("--set", default="", help="k=v,... applied to every variant")
    ap.add_argument("--variant", action="append", default=None, help="k=v,... on top of "
                    "--set (\"\" = the settings as they are); repeatable, the first is the base")
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from specdraft.train.data import rank_micro_batches
    from specdraft.train.loop import Window
    from specdraft.train.metrics import summarize

    manifest = json.loads((args.train / "manifest.json").read_text())
    run_dir = Path(manifest["config"]["run_dir"])
    base = {**manifest["config"], **parse_sets(args.set)}
    variants = args.variant or [""]
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for stage in ("generate", "prepare", "vocab", "extract"):
            (scratch / stage).symlink_to((run_dir / stage).resolve())
        trainers = [build_trainer({**base, **parse_sets(v)}, scratch, args.drafter)
                    for v in variants]
        plan = trainers[0].plan(0)
        for tr in trainers:  # the argmax cache filled: an epoch after the first
            for s in range(args.steps):
                for mb in rank_micro_batches(plan, s, 0, 1, 1):
                    tr.load(mb)
        times = [[] for _ in trainers]
        windows = [Window(tr.objective.steps) for tr in trainers]
        for _ in range(args.rounds):
            for i, tr in enumerate(trainers):
                t0 = time.perf_counter()
                for s in range(args.steps):
                    tr.step_in_epoch = s
                    tr.train_step(windows[i])
                times[i].append((time.perf_counter() - t0) / args.steps)
    first = statistics.median(times[0])
    for v, ts, w in zip(variants, times, windows):
        m = summarize(w.counts)
        print(json.dumps({"variant": v or "(as trained)",
                          "s_per_step": round(statistics.median(ts), 3),
                          "range": [round(min(ts), 3), round(max(ts), 3)],
                          "vs_first": round(statistics.median(ts) / first, 3),
                          "acc": [round(a, 3) for a in m["acc"]],
                          "cond_acc": [round(a, 3) for a in m["cond_acc"]],
                          "tau_hat": round(m["tau"], 3)}), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
