"""The serve plan's predicted ranking against vLLM's measured decode throughput (issue #26 item 3).

On one trained run (default ``runs/demo``, the drafter ``make demo`` trains on SmolLM2-135M):

1. ``specdraft eval --sweep 1,2,..`` decodes the prompts offline at each draft length k and
   predicts each k's speedup from its cost model (constants timed here: docs/trees-and-serve-plan.md);
2. the real vLLM CPU engine decodes the same rendered prompts without speculation and with the
   run's export at each k, one prompt at a time (``max_num_seqs`` 1: the single-stream latency
   the cost model describes), interleaved over ``--reps`` rounds; measured speedup = median
   tokens/s with k ÷ median tokens/s without;
3. prints per k: τ offline and in the engine, predicted and measured speedup, and whether the
   two rankings agree (Spearman ρ and the best k of each).

Usage: ``python benchmarks/bench_serve_plan.py [--run-dir runs/demo] [--ks 1,2,3,4]
[--limit 8] [--max-new-tokens 64] [--reps 2] [--out /tmp/bench-serve-plan] [--reuse]``. Needs the vLLM
venv (``make install-vllm``) and a quiet machine: the figures are ratios measured in one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def offline_plan(args: argparse.Namespace) -> dict:
    """``specdraft eval --sweep`` on the run's export; returns results.json."""
    out = args.out / "offline"
    if args.reuse:
        return json.loads((out / "results.json").read_text())
    cmd = [sys.executable, "-m", "specdraft.cli", "eval", "--run-dir", str(args.run_dir),
           "--prompts", args.prompts, "--limit", str(args.limit), "--max-new-tokens",
           str(args.max_new_tokens), "--sweep", args.ks, "--out", str(out), "--engine", "none",
           "--overwrite"]
    subprocess.run(cmd, check=True, cwd=REPO)
    return json.loads((out / "results.json").read_text())


def rendered_prompts(args: argparse.Namespace) -> tuple[list[list[int]], list[int]]:
    """The prompt ids and stop ids exactly as eval rendered them (the run's chat format)."""
    from specdraft.core.chat import generation_stop_ids
    from specdraft.core.verifier import load_tokenizer, load_verifier
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.prompts import eval_chat_format, load_prompts, render

    cfg = EvalConfig(run_dir=str(args.run_dir), prompts=args.prompts, limit=args.limit,
                     out=str(args.out / "render"))
    tok = load_tokenizer(cfg.verifier)
    fmt = eval_chat_format(cfg, tok)
    ids = [render(tok, p["messages"], fmt) for p in load_prompts(cfg.prompts, cfg.limit)]
    return ids, generation_stop_ids(load_verifier(cfg.verifier), tok, fmt)


def engine_throughput(args: argparse.Namespace, ks: list[int]) -> dict[str, list[dict]]:
    """vLLM runs, interleaved: ``base`` (no drafter) and ``k{k}``, ``--reps`` times each."""
    from specdraft.artifacts.layout import RunLayout
    from specdraft.engines.verifier_dir import engine_hf_dir
    from specdraft.engines.python import vllm_python
    from specdraft.eval.engine import run_worker, vllm_job

    if args.reuse:
        res = json.loads((args.out / "engine" / "engine-out.json").read_text())
        return _by_name(res)
    prompts, stops = rendered_prompts(args)
    drafter = RunLayout(args.run_dir).drafter()
    runs = [{"name": "base", "drafter": None, "k": 0},
            *({"name": f"k{k}", "drafter": str(drafter), "k": k} for k in ks)] * args.reps
    job = vllm_job(verifier_dir=engine_hf_dir("smollm2", args.run_dir), drafter_dir=None,
                   prompts=prompts, k=max(ks), temperature=0.0, max_tokens=args.max_new_tokens,
                   stop_ids=stops, dtype="float32")
    job["runs"], job["max_num_seqs"] = runs, 1
    return _by_name(run_worker(vllm_python(None), job, args.out / "engine", timeout_s=3600))


def _by_name(res: dict) -> dict[str, list[dict]]:
    by_name: dict[str, list[dict]] = {}
    for r in res["runs"]:
        by_name.setdefault(r["name"], []).append(r)
    return by_name


def tokens_per_s(run: dict) -> float:
    return sum(len(t) for t in run["tokens"]) / run["generate_s"]


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's ρ of two equal-length lists without ties (ranks 1..n)."""
    ra = {i: r for r, i in enumerate(sorted(range(len(a)), key=a.__getitem__))}
    rb = {i: r for r, i in enumerate(sorted(range(len(b)), key=b.__getitem__))}
    n = len(a)
    d2 = sum((ra[i] - rb[i]) ** 2 for i in range(n))
    return 1 - 6 * d2 / (n * (n * n - 1)) if n > 1 else 1.0


def engine_tau(run: dict) -> float:
    """τ from the worker's differenced counters (``drafts``, ``accepted``), bonus included."""
    c = run["counters"]
    return 1 + c["accepted"] / c["drafts"] if c.get("drafts") else 1.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", type=Path, default=REPO / "runs" / "demo")
    p.add_argument("--prompts", default="builtin:demo_eval")
    p.add_argument("--ks", default="1,2,3,4")
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("/tmp/bench-serve-plan"))
    p.add_argument("--reuse", action="store_true", help="print the table from --out's files")
    args = p.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    plan = offline_plan(args)["serve_plan"]
    predicted = {int(s["steps"]): s for s in plan["settings"] if s["topk"] == 1}
    runs = engine_throughput(args, ks)
    base = statistics.median(tokens_per_s(r) for r in runs["base"])
    print(f"cost model: {plan['cost_model']}")
    print(f"vLLM without speculation: {base:.1f} tokens/s (rounds: "
          f"{', '.join(f'{tokens_per_s(r):.1f}' for r in runs['base'])})")
    print("k  tau_offline  tau_vllm  predicted_speedup  measured_speedup  (tokens/s)")
    pred, meas = [], []
    for k in ks:
        tps = statistics.median(tokens_per_s(r) for r in runs[f"k{k}"])
        s = predicted[k]
        pred.append(s["predicted_speedup"])
        meas.append(tps / base)
        reps = ", ".join(f"{tokens_per_s(r):.1f}" for r in runs[f"k{k}"])
        print(f"{k}  {s['tau']:.3f}        {engine_tau(runs[f'k{k}'][0]):.3f}     "
              f"{s['predicted_speedup']:.3f}              {tps / base:.3f}             "
              f"({reps})")
    best_p, best_m = ks[pred.index(max(pred))], ks[meas.index(max(meas))]
    print(f"ranking: Spearman rho {spearman(pred, meas):+.2f}; best k predicted {best_p}, "
          f"measured {best_m}; speculation pays off (measured > 1) at "
          f"{[k for k, m in zip(ks, meas) if m > 1] or 'no k'}")


if __name__ == "__main__":
    main()
