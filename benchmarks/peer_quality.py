"""``bench_quality.py --peer``: speculators 0.9.0 trained on specdraft's rows and hidden states.

After the specdraft pipeline of ``bench_quality.py`` has run in ``RUN``:

1. ``RUN/peer/data``: ``RUN/extract`` converted by ``peer_data.py`` (exact up to a 1e-5 relative
   norm factor, its docstring says why), rows in the order train split then validation split
   of specdraft's own ``split_indices``, so ``--train-data-ratio`` gives the peer the same
   training and validation rows; specdraft's ``d2t``/``t2d``; ``RUN/peer/verifier`` holds the
   verifier's head, embedding and final-norm gain.
2. speculators' own trainer (``peer_speculators.py``, its venv) with specdraft's recipe where
   speculators has the flag: same epochs, AdamW at the same peak lr, cosine with the same
   warmup steps, weight decay 0, same TTT depth, ``--total-seq-len`` = specdraft's
   ``batch_tokens``. Its own choices stay: step-loss decay 1.0 (ours 0.8), grad clip 1.0 (ours
   0.5), AdamW betas (its defaults), rows packed without padding, last epoch's weights kept
   (stored in bf16 by its checkpointer), ``lm_head`` copied from the verifier's draft-vocab rows
   and frozen (ours copied, then trained: ``--lm-head-init``).
3. Its checkpoint (speculators format) is read by specdraft's export reader and measured by the
   same offline eval on the same prompts as specdraft's drafter.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
from specdraft.eval.compare import tau_ratio_ci

import peer_data
from bench_train_peer import REPO, child_env, peer_args


def convert(run_dir: Path, train_cfg: Any, verifier: Any) -> tuple[Path, Path, float, int]:
    """``RUN/peer/data`` and ``RUN/peer/verifier`` (cached); returns them, the train ratio
    and the number of training rows."""
    from specdraft.artifacts.hidden_states import DiskSource, load_verifier_head
    from specdraft.train.data import split_indices
    from specdraft.artifacts.vocab_map import load_vocab_map

    out = run_dir / "peer"
    data, vdir = out / "data", out / "verifier"
    source = DiskSource(run_dir / "extract")
    train, val = split_indices(source.keys(), train_cfg.val_fraction, train_cfg.seed)
    ratio = (len(train) + 0.5) / len(source)  # int(N * ratio) == len(train)
    if not (out / "converted.json").exists():
        gain = peer_data.effective_gain(verifier.model.norm.weight, verifier.config.model_type)
        t0 = time.monotonic()
        peer_data.convert_source(source, train + val, data, gain)
        peer_data.write_vocab(data, *load_vocab_map(run_dir))
        head = load_verifier_head(run_dir / "extract")
        peer_data.write_verifier_dir(vdir, verifier.config, head["embed_tokens.weight"],
                                     head["lm_head.weight"], gain)
        (vdir / "aux_ids.json").write_text(json.dumps(list(source.aux_layer_ids)))
        (out / "converted.json").write_text(json.dumps(
            {"rows": len(source), "train": len(train), "val": len(val),
             "seconds": time.monotonic() - t0}))
    return data, vdir, ratio, len(train)


def train_peer(run_dir: Path, train_cfg: Any, data: Path, vdir: Path, ratio: float) -> Path:
    """Run speculators' trainer (cached); returns the directory of its last epoch's weights."""
    save = run_dir / "peer" / "train"
    done = run_dir / "peer" / "trained.json"
    if not done.exists():
        import shutil

        shutil.rmtree(save, ignore_errors=True)
        total = json.loads((run_dir / "train" / "manifest.json").read_text())["total_steps"]
        warmup = min(train_cfg.warmup_steps, total // 2)
        aux = json.loads((vdir / "aux_ids.json").read_text())
        K = len(__import__("numpy").load(data / "d2t.npy"))
        cmd = [str(peer_data.peer_python(REPO)), str(Path(__file__).parent / "peer_speculators.py"),
               "--threads", str(torch.get_num_threads()), "--",
               *peer_args(vdir, data, save, aux=aux, draft_vocab=K, seq=train_cfg.batch_tokens,
                          ttt=train_cfg.ttt_steps, epochs=train_cfg.epochs, lr=train_cfg.lr),
               "--train-data-ratio", f"{ratio:.6f}", "--scheduler-type", "cosine",
               "--scheduler-warmup-steps", str(warmup), "--weight-decay", "0.0",
               "--seed", str(train_cfg.seed), "--log-freq", "10"]
        t0 = time.monotonic()
        save.mkdir(parents=True, exist_ok=True)
        with open(run_dir / "peer" / "train.log", "w") as log:
            rc = subprocess.run(cmd, env=child_env(torch.get_num_threads(), None), stdout=log,
                                stderr=subprocess.STDOUT, cwd=REPO).returncode
        if rc != 0:
            raise SystemExit(f"speculators' trainer failed ({rc}); see {run_dir}/peer/train.log")
        done.write_text(json.dumps({"seconds": time.monotonic() - t0, "warmup": warmup}))
    epochs = sorted(int(d.name) for d in save.iterdir() if d.is_dir() and not d.is_symlink()
                    and d.name.isdigit())
    return save / str(epochs[-1])


#: The longest context the benchmark evaluates (prompt + new tokens) is far below this; a
#: sliding window at least this wide computes exactly what full attention does on it.
EVAL_CONTEXT_BOUND = 2048


def eval_ready(ckpt: Path, out: Path) -> Path:
    """``ckpt`` as specdraft's reader takes it: the same tensors, and ``rope_theta`` also at the
    top of ``transformer_layer_config`` when transformers 5 wrote it only inside
    ``rope_parameters`` (specdraft's reader looks only at the top; vLLM reads either).

    speculators 0.9 writes its Llama layer with ``layer_types: ["sliding_attention"]``,
    ``use_sliding_window: true``, ``sliding_window: 2048``; specdraft's reader refuses a window
    (it implements full attention only). Within :data:`EVAL_CONTEXT_BOUND` tokens a window that
    wide is full attention, so the copy says full attention; a narrower window raises
    ValueError."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(ckpt / "model.safetensors", out / "model.safetensors")
    cfg = json.loads((ckpt / "config.json").read_text())
    layer = cfg["transformer_layer_config"]
    rope = layer.get("rope_parameters") or {}
    if "rope_theta" not in layer and "rope_theta" in rope:
        layer["rope_theta"] = rope["rope_theta"]
    if layer.get("use_sliding_window") or "sliding_attention" in (layer.get("layer_types") or []):
        window = layer.get("sliding_window") or 0
        if window < EVAL_CONTEXT_BOUND:
            raise ValueError(f"{ckpt}: sliding_window {window} < {EVAL_CONTEXT_BOUND}: the "
                             f"benchmark's contexts would leave it")
        layer.update(use_sliding_window=False,
                     layer_types=["full_attention"] * len(layer.get("layer_types") or [1]))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def run_peer(args: Any, config: Any, verifier: Any) -> None:
    """Convert, train the peer, eval both drafters' figures side by side (module docstring)."""
    from bench_quality import GSM8K_TEST, MT_BENCH, eval_offline

    run_dir = args.run_dir
    train_cfg = config.stages["train"]
    data, vdir, ratio, n_train = convert(run_dir, train_cfg, verifier)
    ckpt = train_peer(run_dir, train_cfg, data, vdir, ratio)
    drafter = eval_ready(ckpt, run_dir / "peer" / "drafter")
    peer = {"gsm8k": eval_offline(run_dir / "peer" / "eval-gsm8k", drafter, verifier,
                                  GSM8K_TEST, args.eval_limit),
            "mt": eval_offline(run_dir / "peer" / "eval-mtbench", drafter, verifier, MT_BENCH,
                               args.mt_limit)}
    ours = {"gsm8k": json.loads((run_dir / "eval" / "manifest.json").read_text()),
            "mt": json.loads((run_dir / "eval-mtbench" / "manifest.json").read_text())}
    t_ours = json.loads((run_dir / "train" / "manifest.json").read_text())["elapsed_s"]
    t_peer = json.loads((run_dir / "peer" / "trained.json").read_text())["seconds"]
    print(f"\nbench_quality --peer: speculators 0.9.0 on the same {n_train} training rows and "
          f"hidden states, {train_cfg.epochs} epochs, AdamW lr {train_cfg.lr}, TTT "
          f"{train_cfg.ttt_steps}; offline eval greedy, k = 4")
    dirs = {"gsm8k": ("eval", "peer/eval-gsm8k"), "mt": ("eval-mtbench", "peer/eval-mtbench")}
    for name, label in (("gsm8k", f"GSM8K test {args.eval_limit}"),
                        ("mt", f"MT-bench {args.mt_limit or 80}")):
        a, b = ours[name], peer[name]
        ci = tau_ratio_ci(*(json.loads((run_dir / d / "results.json").read_text())
                            for d in dirs[name]))
        pos = lambda m: ", ".join(f"{p:.3f}" for p in m["per_position"])  # noqa: E731
        print(f"  {label:<16} specdraft tau {a['tau']:.3f} [{pos(a)}]   speculators tau "
              f"{b['tau']:.3f} [{pos(b)}]   ratio {ci.ratio:.3f} (95 % CI {ci.low:.3f}-"
              f"{ci.high:.3f} over prompts, paired bootstrap)")
    print(f"  train wall time (s): specdraft {t_ours:.0f}, speculators {t_peer:.0f} "
          f"(its process, imports included)")
    goal = ours["gsm8k"]["tau"] >= 1.25 * peer["gsm8k"]["tau"]
    print(f"  goal specdraft tau >= 1.25 x speculators' on GSM8K: {'MET' if goal else 'NOT MET'}")
