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

``--peer-kind`` (:data:`PEERS`) says which of speculators' drafters, each in its own
``RUN/<dir>``: ``eagle3`` (above), ``eagle3-defaults`` (its EAGLE-3 with its own default norms,
:func:`bench_train_peer.peer_args` ``norms``), ``dflash`` (its DFlash trainer,
:func:`dflash_args`; its checkpoint is converted to vLLM's native DFlash format by
:func:`dflash_eval_ready` and measured the same way).
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


#: ``--peer-kind`` -> the directory under RUN that holds that peer's training and evals.
PEERS = {"eagle3": "peer", "eagle3-defaults": "peer-eagle3-defaults", "dflash": "peer-dflash"}


def dflash_args(verifier: Path, data: Path, save: Path, *, aux: list[int], seq: int,
                epochs: int, lr: float, layers: int, block: int, mask_token_id: int) -> list[str]:
    """speculators 0.9's flags for its DFlash trainer on the rows of ``data``, set to what vLLM
    serves and what specdraft's DFlash trained (docs/benchmarks.md, "speculators' own DFlash
    trainer"): ``layers`` Qwen3 layers, all full attention (its default makes every layer a
    causal sliding window), blocks of ``block``, the full verifier vocabulary, the same mask
    token, ``aux`` (its ids are capture ids, = vLLM's ``target_layer_ids + 1``), AdamW at
    ``lr``, fp32. Its own recipe stays: D-PACE position weights, cross-entropy against the
    verifier's argmax, up to 512 anchors per packed sequence of ``seq`` tokens."""
    return ["--verifier-name-or-path", str(verifier), "--data-path", str(data),
            "--speculator-type", "dflash", "--target-layer-ids", *map(str, aux),
            "--num-layers", str(layers), "--block-size", str(block),
            "--full-attention-indices", *map(str, range(layers)),
            "--draft-vocab-size", str(json.loads((verifier / "config.json").read_text())
                                      ["vocab_size"]),
            "--mask-token-id", str(mask_token_id),
            "--draft-attn-impl", "sdpa", "--loss-implementation", "eager",
            "--optimizer", "adamw", "--lr", str(lr), "--hidden-states-dtype", "float32",
            "--num-workers", "0", "--total-seq-len", str(seq), "--epochs", str(epochs),
            "--save-path", str(save), "--log-dir", str(save / "logs"),
            "--no-resume-from-checkpoint"]


def train_peer(run_dir: Path, train_cfg: Any, data: Path, vdir: Path, ratio: float,
               kind: str = "eagle3") -> Path:
    """Run speculators' trainer for ``kind`` (a key of :data:`PEERS`; cached in its directory);
    returns the directory of its last epoch's weights."""
    out = run_dir / PEERS[kind]
    save, done = out / "train", out / "trained.json"
    if not done.exists():
        import shutil

        shutil.rmtree(save, ignore_errors=True)
        ours_manifest = run_dir / "train" / "manifest.json"  # absent: the peer alone
        total = json.loads(ours_manifest.read_text())["total_steps"] \
            if ours_manifest.exists() else None
        warmup = min(train_cfg.warmup_steps, total // 2) if total else train_cfg.warmup_steps
        if kind == "dflash" and not (run_dir / "export" / "vllm").is_dir():
            raise SystemExit(f"--peer-kind dflash matches specdraft's DFlash export (layers, "
                             f"block, mask token): {run_dir}/export/vllm is missing")
        aux = json.loads((vdir / "aux_ids.json").read_text())
        if kind == "dflash":
            from specdraft.artifacts.dflash_export import read_dflash

            ours, _ = read_dflash(run_dir / "export" / "vllm")  # the drafter to match
            flags = dflash_args(vdir, data, save, aux=aux, seq=train_cfg.batch_tokens,
                                epochs=train_cfg.epochs, lr=train_cfg.lr,
                                layers=ours.num_hidden_layers, block=ours.block_size,
                                mask_token_id=ours.mask_token_id)
        else:
            K = len(__import__("numpy").load(data / "d2t.npy"))
            flags = peer_args(vdir, data, save, aux=aux, draft_vocab=K,
                              seq=train_cfg.batch_tokens, ttt=train_cfg.ttt_steps,
                              epochs=train_cfg.epochs, lr=train_cfg.lr,
                              norms=kind == "eagle3-defaults")
        cmd = [str(peer_data.peer_python(REPO)), str(Path(__file__).parent / "peer_speculators.py"),
               "--threads", str(torch.get_num_threads()), "--", *flags,
               "--train-data-ratio", f"{ratio:.6f}", "--scheduler-type", "cosine",
               "--scheduler-warmup-steps", str(warmup), "--weight-decay", "0.0",
               "--seed", str(train_cfg.seed), "--log-freq", "10"]
        t0 = time.monotonic()
        save.mkdir(parents=True, exist_ok=True)
        with open(out / "train.log", "w") as log:
            rc = subprocess.run(cmd, env=child_env(torch.get_num_threads(), None), stdout=log,
                                stderr=subprocess.STDOUT, cwd=REPO).returncode
        if rc != 0:
            raise SystemExit(f"speculators' trainer failed ({rc}); see {out}/train.log")
        done.write_text(json.dumps({"seconds": time.monotonic() - t0, "warmup": warmup,
                                    "kind": kind}))
    epochs = sorted(int(d.name) for d in save.iterdir() if d.is_dir() and not d.is_symlink()
                    and d.name.isdigit())
    return save / str(epochs[-1])


def dflash_eval_ready(ckpt: Path, out: Path, target_num_layers: int) -> Path:
    """speculators' DFlash checkpoint ``ckpt`` written to ``out`` in vLLM's native DFlash format
    by specdraft's validated exporter (:func:`specdraft.artifacts.dflash_export.export_dflash`),
    weights widened to float32 (exact), so specdraft's offline eval and vLLM read the same.

    The mapping (facts from ``speculators/models/dflash/core.py`` and vLLM's
    ``qwen3_dflash.py``): the layer shape from ``transformer_layer_config``; vLLM's
    ``target_layer_ids`` = its ``aux_hidden_state_layer_ids`` - 1 (layer outputs vs capture
    ids); ``mask_token_id``, ``block_size`` as they are; tensor names are vLLM's already.
    Raises ValueError for what vLLM would not serve as trained: a sliding or causal layer, a
    reduced draft vocabulary, ``sample_from_anchor``."""
    from safetensors.torch import load_file

    from specdraft.artifacts.dflash_export import export_dflash
    from specdraft.core.aux_ids import hf_to_dflash_target_ids
    from specdraft.models.dflash import DFlashConfig, DFlashDraftModel

    cfg = json.loads((ckpt / "config.json").read_text())
    layer = cfg["transformer_layer_config"]
    bad = []
    if any(t != "full_attention" for t in layer.get("layer_types") or []):
        bad.append(f"layer_types={layer['layer_types']} (sliding, causal unless told)")
    if cfg["draft_vocab_size"] != layer["vocab_size"]:
        bad.append(f"draft_vocab_size={cfg['draft_vocab_size']} (vLLM's DFlash has none)")
    if cfg.get("sample_from_anchor"):
        bad.append("sample_from_anchor=true (vLLM drafts after the anchor)")
    if bad:
        raise ValueError(f"{ckpt}: not servable by vLLM as trained: {bad}")
    rope = layer.get("rope_parameters") or {}
    c = DFlashConfig(**{k: layer[k] for k in (
        "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "num_hidden_layers", "rms_norm_eps", "max_position_embeddings",
        "vocab_size", "hidden_act")},
        rope_theta=float(rope.get("rope_theta", layer.get("rope_theta"))),
        target_hidden_size=cfg.get("target_hidden_size") or layer["hidden_size"],
        target_num_layers=target_num_layers,
        target_layer_ids=tuple(hf_to_dflash_target_ids(cfg["aux_hidden_state_layer_ids"])),
        mask_token_id=int(cfg["mask_token_id"]), block_size=int(cfg["block_size"]),
        causal=False)
    model = DFlashDraftModel(c)
    missing, unexpected = model.load_state_dict(
        {k: v.float() for k, v in load_file(str(ckpt / "model.safetensors")).items()},
        strict=False)
    if unexpected or any(not m.startswith(("rotary.", "embed_tokens.", "lm_head."))
                         for m in missing):
        raise ValueError(f"{ckpt}: tensors differ from specdraft's DFlash: missing {missing}, "
                         f"unexpected {unexpected}")
    return export_dflash(model, out, dtype=torch.float32)


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
    """Convert, train the peer (``args.peer_kind``), eval both drafters' figures side by side
    (module docstring). ``args.peer_train_only``: stop after training, printing both train
    times and :func:`bench_quality.wallclock_epochs`; specdraft's drafter not evaluated in
    ``RUN`` (``--until`` before eval, or before train: specdraft's trainer not run): the
    peer's figures alone."""
    from bench_quality import GSM8K_TEST, MT_BENCH, eval_offline

    run_dir, kind = args.run_dir, args.peer_kind
    peer_dir = run_dir / PEERS[kind]
    train_cfg = config.stages["train"]
    data, vdir, ratio, n_train = convert(run_dir, train_cfg, verifier)
    ckpt = train_peer(run_dir, train_cfg, data, vdir, ratio, kind)
    t_peer = json.loads((peer_dir / "trained.json").read_text())["seconds"]
    if args.peer_train_only:
        from bench_quality import wallclock_epochs, wallclock_steps

        ours = json.loads((run_dir / "train" / "manifest.json").read_text())
        t_ours, steps = ours["elapsed_s"], ours["steps"]
        n = wallclock_epochs(train_cfg.epochs, t_ours, t_peer)
        print(f"\nbench_quality --peer-train-only: {train_cfg.epochs} epochs each; train wall "
              f"time (s) specdraft {t_ours:.0f} (its train stage, {steps} steps), speculators "
              f"({kind}) {t_peer:.0f} (its process, imports included): specdraft's trainer "
              f"fits {n} epochs, {wallclock_steps(steps, t_ours, t_peer)} steps, in the peer's "
              f"time (valid as a budget only if both ran alone)")
        return
    drafter = dflash_eval_ready(ckpt, peer_dir / "drafter", verifier.config.num_hidden_layers) \
        if kind == "dflash" else eval_ready(ckpt, peer_dir / "drafter")
    sets = ("gsm8k",) if args.mt_limit == 0 else ("gsm8k", "mt")  # --mt-limit 0: no MT-bench
    peer = {"gsm8k": eval_offline(peer_dir / "eval-gsm8k", drafter, verifier,
                                  GSM8K_TEST, args.eval_limit)}
    if "mt" in sets:
        peer["mt"] = eval_offline(peer_dir / "eval-mtbench", drafter, verifier, MT_BENCH,
                                  args.mt_limit)
    if not (run_dir / "eval" / "manifest.json").exists():  # --until before eval: peer alone
        for name, m in peer.items():
            print(f"bench_quality --peer: speculators ({kind}) {name} tau {m['tau']:.3f} "
                  f"{[round(p, 3) for p in m['per_position']]} (specdraft's drafter of this run "
                  "not evaluated: compare with quality_table.py)")
        return
    ours = {"gsm8k": json.loads((run_dir / "eval" / "manifest.json").read_text())}
    if "mt" in sets:
        ours["mt"] = json.loads((run_dir / "eval-mtbench" / "manifest.json").read_text())
    shape = f"blocks of {train_cfg.dflash_block_size}" if kind == "dflash" else \
        f"TTT {train_cfg.ttt_steps}"
    print(f"\nbench_quality --peer: speculators 0.9.0 ({kind}) on the same {n_train} training "
          f"rows and hidden states, {train_cfg.epochs} epochs, AdamW lr {train_cfg.lr}, "
          f"{shape}; offline eval greedy, k = 4")
    dirs = {"gsm8k": (run_dir / "eval", peer_dir / "eval-gsm8k"),
            "mt": (run_dir / "eval-mtbench", peer_dir / "eval-mtbench")}
    labels = {"gsm8k": f"GSM8K test {args.eval_limit}", "mt": f"MT-bench {args.mt_limit or 80}"}
    for name in sets:
        label = labels[name]
        a, b = ours[name], peer[name]
        ci = tau_ratio_ci(*(json.loads((d / "results.json").read_text()) for d in dirs[name]))
        pos = lambda m: ", ".join(f"{p:.3f}" for p in m["per_position"])  # noqa: E731
        print(f"  {label:<16} specdraft tau {a['tau']:.3f} [{pos(a)}]   speculators tau "
              f"{b['tau']:.3f} [{pos(b)}]   ratio {ci.ratio:.3f} (95 % CI {ci.low:.3f}-"
              f"{ci.high:.3f} over prompts, paired bootstrap)")
    t_ours = json.loads((run_dir / "train" / "manifest.json").read_text())["elapsed_s"]
    print(f"  train wall time (s): specdraft {t_ours:.0f}, speculators {t_peer:.0f} "
          f"(its process, imports included)")
    goal = ours["gsm8k"]["tau"] >= 1.25 * peer["gsm8k"]["tau"]
    print(f"  goal specdraft tau >= 1.25 x speculators' on GSM8K: {'MET' if goal else 'NOT MET'}")
