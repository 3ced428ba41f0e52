"""specdraft's CUDA paths, checked in one short run on one GPU (issue #39 item 7).

No GPU had run specdraft before this script: the ``fused`` TTT attention with its CUDA
log-sum-exp kernel, bf16 autocast at the job's width and extraction on CUDA were tested only by
reading. Each check runs specdraft's own code (the drafter of :mod:`specdraft.models.eagle3` /
:mod:`specdraft.models.eagle3_mla` shaped by ``from_profile``, the TTT objective of
:mod:`specdraft.train.objective` under :func:`specdraft.train.loop.autocast_context` with the
optimizer of :func:`specdraft.train.loop.make_optimizer`, the verifier loader and
:func:`specdraft.core.capture.capture_packed` of the extract stage) and prints one line::

    gpu_check NAME PASS|FAIL|SKIP key=value ...

Checks, in this order (a check is not started once ``--deadline-s`` has passed: it prints SKIP):

- ``train_h4096_fp32``, ``train_kimi_mla_fp32``: one forward + backward of the TTT objective in
  fp32 with ``fused`` attention and again with ``split`` on the same weights and batch (one row
  of 2,048 tokens, 7 TTT steps). PASS when the fused kernel really ran (no fallback to
  ``split``), and the loss and every parameter's gradient agree within ``FP32_TOL`` (relative,
  ``|a - b| / |b|`` over the whole tensor; the tolerance :data:`specdraft.models.eagle3.
  CHECK_TOLERANCE` gives fp32). Shapes: a Llama-3.1-8B verifier (hidden 4,096, 32 heads of 128,
  8 KV heads, MLP 14,336, V 128,256) and Kimi-K2.5's text model (hidden 7,168, 64 heads, MLA
  ``q_lora_rank`` 1,536, ``kv_lora_rank`` 512, q/k 128 + 64 rope, v 128, MLP 18,432,
  V 163,840) with ``--drafter-layer mla``; draft vocabulary 32,000; TF32 off.
- ``extract_cuda_vs_cpu``: two small random verifiers built in-process from a config (a 4-layer
  Llama, and the Kimi-shaped DeepSeek-V3 of ``tests/kimi_fixture.py``: MLA, YaRN, MoE), saved,
  loaded by the extract stage's loader in fp32 on the device and on the CPU, captured with
  ``capture_packed`` (fp32 codec) on the same rows. PASS when the device's aux and final states
  equal the CPU's within ``FP32_TOL`` (relative, per tensor). ``llama_fp32_vs_fp64`` is the
  Llama's CPU fp32 result against its CPU fp64 one: the size of fp32 rounding, for scale
  (transformers' MoE kernels take no fp64).
- ``train_h4096_bf16``, ``train_kimi_mla_bf16``: training steps as ``train --dtype bfloat16``
  runs them (autocast over fp32 master weights, ``fused`` attention, clip 0.5, AdamW) on a
  micro-batch of 4 rows of 2,048 tokens (the default ``--batch-tokens 8192``), 7 TTT steps:
  one warm-up step, then ``--iters`` timed. Printed: row tokens per second, MFU, peak memory
  (``torch.cuda.max_memory_allocated`` over the timed steps, GiB; on CPU the process's peak
  RSS), and the warm-up step's loss against the fp32 loss of the same weights and batch. PASS
  when the fused kernel ran in bf16, loss and gradient norm are finite and the two losses agree
  within ``BF16_LOSS_TOL`` (relative).

MFU = counted FLOPs per second / ``--peak-tflops`` (790: the dense bf16 matmul rate measured on
the lent H200, not its 989 datasheet figure). Counted FLOPs (:func:`train_flops`): matmuls
only, 2 per multiply-add; forward = ``fc`` on the L = T-1 columns of each row once, then per
TTT step the midlayer's linear layers on the live columns (those some step supervises,
``Eagle3DraftModel.ttt_step_live``; at step 0 q/k/v on every column), the ``lm_head`` on
that step's supervised columns, attention over the causal half (``2·h·(d_qk + d_v)`` per
query-key pair: L(L+1)/2 step-0 pairs plus one per earlier step); backward = 2 × forward,
except ``fc`` (its input needs no gradient: 1 ×). Not counted: norms, softmax, rotary, the
optimizer, the teacher (the batch's soft targets are given), and the kernel's recomputation in
backward.

Run on a lent GPU (docs/scale.md "A GPU check"): ``benchmarks/gpu_check`` (the shell wrapper:
carried wheels, then this script). Dry run on a CPU (CI, ``tests/benchmarks/test_gpu_check.py``):
``python benchmarks/gpu_check.py --device cpu --tiny`` (tiny shapes, the same checks; on CPU
``fused`` runs PyTorch's CPU flash kernel and the extract check compares the CPU with itself).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # kimi_fixture: the Kimi-shaped tiny verifier

#: Relative tolerance, fused vs split and device vs CPU, in fp32: the fp32 entry of
#: :data:`specdraft.models.eagle3.CHECK_TOLERANCE`, the one the runtime kernel check uses.
FP32_TOL = 1e-4
#: Relative tolerance of the bf16 autocast loss against the fp32 loss of the same weights.
BF16_LOSS_TOL = 2e-2
#: The lent H200's dense bf16 matmul rate (TFLOP/s), the MFU denominator.
PEAK_TFLOPS = 790.0
DRAFT_VOCAB = 32_000

# Kimi-K2.5's text model (DeepSeek-V3 layout), as its config.json gives it.
KIMI = dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
            num_hidden_layers=61, num_attention_heads=64, num_key_value_heads=64,
            n_routed_experts=384, num_experts_per_tok=8, n_shared_experts=1,
            first_k_dense_replace=1, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
            qk_rope_head_dim=64, v_head_dim=128, vocab_size=163840,
            max_position_embeddings=131072)
# Llama-3.1-8B.
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                max_position_embeddings=131072, rope_theta=500000.0)
# The --tiny shapes: the same layouts (MLA with a low-rank query, a shared expert, a dense first
# layer; grouped-query attention) at hidden 64.
TINY_KIMI = {**KIMI, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
             "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2,
             "n_routed_experts": 4, "num_experts_per_tok": 2, "q_lora_rank": 32,
             "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
             "v_head_dim": 16, "vocab_size": 512}
TINY_LLAMA = {**LLAMA_8B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "vocab_size": 512, "max_position_embeddings": 4096, "rope_theta": 10000.0}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The run's sizes: draft vocabulary, fp32 row length, bf16 micro-batch, TTT steps."""

    draft_vocab: int
    fp32_T: int
    bf16_rows: int
    bf16_T: int
    steps: int


FULL = Sizes(DRAFT_VOCAB, 2048, 4, 2048, 7)
TINY = Sizes(256, 48, 2, 48, 3)


# ------------------------------------------------------------------ shapes and drafters


def verifier_config(kind: str, tiny: bool) -> Any:
    """The HF config of the verifier a drafter is shaped from (``kind`` ``h4096`` or ``kimi``;
    ``tiny``: the same layout at hidden 64)."""
    import transformers as tf

    from kimi_fixture import KIMI_YARN

    if kind == "h4096":
        return tf.LlamaConfig(**(TINY_LLAMA if tiny else LLAMA_8B))
    config = tf.DeepseekV3Config(**(TINY_KIMI if tiny else KIMI), rope_parameters=dict(KIMI_YARN),
                                 rope_interleave=True, n_group=1, topk_group=1)
    config.scoring_func, config.topk_method = "sigmoid", "noaux_tc"
    return config


def build_drafter(kind: str, tiny: bool, device: torch.device, draft_vocab: int,
                  attn_impl: str = "fused") -> torch.nn.Module:
    """The drafter ``train`` builds for that verifier (``from_profile``'s shape rules; ``kimi``
    with ``--drafter-layer mla``), random weights, fp32, built on ``device``."""
    from specdraft.core.capture import default_aux_ids
    from specdraft.core.profile import resolve_profile
    from specdraft.models.eagle3 import Eagle3Config
    from specdraft.models.eagle3_mla import Eagle3MLAConfig
    from specdraft.artifacts.drafter import drafter_from_dict

    hf = verifier_config(kind, tiny)
    profile = resolve_profile(hf)
    cls = Eagle3MLAConfig if kind == "kimi" else Eagle3Config
    config = cls.from_profile(profile, draft_vocab_size=draft_vocab,
                              aux_layer_ids=default_aux_ids(profile.n_layers),
                              attn_impl=attn_impl)
    torch.manual_seed(0)
    with device:
        return drafter_from_dict(config.to_dict())


def make_batch(model: torch.nn.Module, rows: int, T: int, device: torch.device) -> Any:
    """A random :class:`~specdraft.artifacts.batches.TrainBatch` of ``rows`` x ``T`` tokens:
    the first T/8 positions a prompt (unsupervised), soft targets ``softmax(3·N(0,1))`` over the
    draft vocabulary, labels their argmax. Aux states N(0, 1) of the drafter's input width.
    Drawn on ``device`` (its own generator, seed 1)."""
    from specdraft.artifacts.batches import TrainBatch

    c = model.config
    g = torch.Generator(device).manual_seed(1)
    sup = torch.ones(rows, T, dtype=torch.bool, device=device)
    sup[:, : T // 8] = False
    n = int(sup.sum())
    probs = torch.softmax(torch.randn(n, c.draft_vocab_size, generator=g, device=device) * 3, -1)
    label = torch.full((rows, T), -1, dtype=torch.long, device=device)
    label[sup] = probs.argmax(-1)
    ids = torch.randint(0, c.vocab_size, (rows, T), generator=g, device=device)
    aux = torch.randn(rows, T, c.n_aux * c.target_hidden_size, generator=g, device=device)
    return TrainBatch(ids, aux, sup, probs, label, rows * T)


def train_flops(model: torch.nn.Module, batch: Any, steps: int) -> float:
    """Matmul FLOPs of one forward + backward of the TTT objective (module doc's formula)."""
    from specdraft.train.objective import shift

    c = model.config
    B, T = batch.input_ids.shape
    L = T - 1
    p_fc = model.fc.weight.numel()
    p_layer = sum(m.weight.numel() for m in model.midlayer.modules()
                  if isinstance(m, torch.nn.Linear))
    attn = model.midlayer.self_attn
    p_qkv = sum(m.weight.numel() for m in attn.modules()
                if isinstance(m, torch.nn.Linear) and m is not attn.o_proj)
    p_head = model.lm_head.weight.numel()
    d_v = getattr(c, "v_head_dim", c.head_dim)
    sups = [shift(batch.sup, k, L, False) for k in range(steps)]
    live = int(torch.stack(sups).any(0).sum())  # columns the layer runs at (ttt_step_live)
    forward = 2.0 * B * L * p_fc
    for k in range(steps):
        n_k = int(sups[k].sum())
        pairs = L * (L + 1) / 2 + k * L
        qkv_cols = B * L if k == 0 else live  # step 0: every column's q/k/v
        forward += 2.0 * qkv_cols * p_qkv + 2.0 * live * (p_layer - p_qkv) + 2.0 * n_k * p_head
        forward += 2.0 * B * c.num_attention_heads * (c.head_dim + d_v) * pairs
    return 3 * forward - 2.0 * B * L * p_fc


# ------------------------------------------------------------------ small helpers


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` over the whole tensor (Frobenius norms, fp64)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def kernel_used(device: torch.device, dtype: torch.dtype, head_dim: int) -> tuple[bool, str]:
    """Whether ``fused`` runs its fused kernel for this device, dtype and head width (not the
    ``split`` fallback), and the fallback's warning when it does not."""
    from specdraft.models.eagle3 import fused_kernel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = fused_kernel(device, dtype, head_dim)
    why = "; ".join(str(w.message) for w in caught)
    return kernel is not None, why or "no kernel for this device"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float:
    """Peak memory since :func:`reset_peak` (CUDA) or the process's peak RSS (CPU), GiB."""
    from specdraft.train.loop import peak_memory_mb

    return peak_memory_mb(device) / 1024


def ttt_step(obj: Any, batch: Any, dtype: str, device: torch.device) -> Any:
    """Forward + backward of the TTT objective as ``Trainer.train_step`` runs one micro-batch:
    the loss normaliser from ``loss_counts``, the forward under ``autocast_context``."""
    from specdraft.train.loop import autocast_context

    norm = obj.loss_counts(batch).clamp(min=1)
    with autocast_context(dtype, device):
        out = obj(batch, norm)
    out.loss.backward()
    return out


# ------------------------------------------------------------------ the checks


def fused_objective(kind: str, args: argparse.Namespace, dtype: torch.dtype
                    ) -> tuple[Any, dict[str, Any] | None]:
    """The check's drafter (:func:`build_drafter`) in the TTT objective, and the FAIL result
    when ``fused`` would fall back to ``split`` for q/k/v of ``dtype`` (else None)."""
    from specdraft.train.objective import TTTObjective

    model = build_drafter(kind, args.tiny, args.device, args.sizes.draft_vocab)
    used, why = kernel_used(args.device, dtype, model.config.head_dim)
    failure = None if used else {"status": "FAIL", "error": f"fused fell back to split in "
                                 f"{str(dtype).removeprefix('torch.')}: {why}"}
    return TTTObjective(model, steps=args.sizes.steps), failure


def check_fused_vs_split(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """fp32 TTT step with ``fused`` and with ``split`` on the same weights and batch."""
    dev, sizes = args.device, args.sizes
    obj, failure = fused_objective(kind, args, torch.float32)
    if failure:
        return failure
    model = obj.drafter
    batch = make_batch(model, 1, sizes.fp32_T, dev)
    runs = {}
    for impl in ("fused", "split"):
        model.config = dataclasses.replace(model.config, attn_impl=impl)
        obj.zero_grad(set_to_none=True)
        loss = ttt_step(obj, batch, "float32", dev).loss.detach()
        grads = {n: p.grad.detach().clone() for n, p in obj.named_parameters()
                 if p.grad is not None}
        runs[impl] = (loss, grads)
    (loss_f, grads_f), (loss_s, grads_s) = runs["fused"], runs["split"]
    if args.plant_fault == "grad":  # the check must catch a 1 % error in one gradient
        name = next(iter(grads_f))
        grads_f[name] = grads_f[name] * 1.01
    errs = {n: rel_err(grads_f[n], grads_s[n]) for n in grads_s}
    worst = max(errs, key=errs.get)
    max_abs = max(float((grads_f[n] - grads_s[n]).abs().max()) for n in grads_s)
    loss_err = rel_err(loss_f, loss_s)
    ok = set(grads_f) == set(grads_s) and max(loss_err, errs[worst]) <= args.fp32_tol
    return {"status": "PASS" if ok else "FAIL", "loss": float(loss_s), "loss_rel": loss_err,
            "grad_rel_max": errs[worst], "grad_rel_worst": worst, "grad_abs_max": max_abs,
            "n_grads": len(errs), "tol": args.fp32_tol, "T": sizes.fp32_T,
            "ttt_steps": sizes.steps, "head_dim": model.config.head_dim,
            "trainable_params": sum(p.numel() for p in obj.parameters() if p.requires_grad)}


def check_bf16(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """Timed bf16 autocast training steps: tokens/s, MFU, peak memory, loss against fp32."""
    from specdraft.train.config import TrainConfig
    from specdraft.train.loop import make_optimizer

    dev, sizes = args.device, args.sizes
    obj, failure = fused_objective(kind, args, torch.bfloat16)
    if failure:
        return failure
    model = obj.drafter
    defaults = {k: TrainConfig.model_fields[k].default
                for k in ("lr", "beta1", "beta2", "weight_decay", "grad_clip")}
    opt = make_optimizer(obj, SimpleNamespace(**defaults))
    batch = make_batch(model, sizes.bf16_rows, sizes.bf16_T, dev)
    with torch.no_grad():
        ref = float(obj(batch, obj.loss_counts(batch).clamp(min=1)).loss)

    def step() -> tuple[float, float]:
        loss = float(ttt_step(obj, batch, "bfloat16", dev).loss.detach())
        params = [p for p in obj.parameters() if p.requires_grad]
        gnorm = float(torch.nn.utils.clip_grad_norm_(params, defaults["grad_clip"]))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, gnorm

    loss, gnorm = step()  # warm-up: the optimizer's state is allocated here
    sync(dev)
    reset_peak(dev)
    t0 = time.perf_counter()
    for _ in range(args.iters):
        _, gnorm_i = step()
        gnorm = gnorm if not math.isfinite(gnorm_i) else max(gnorm, gnorm_i)
    sync(dev)
    elapsed = time.perf_counter() - t0
    flops = train_flops(model, batch, sizes.steps) * args.iters
    loss_rel = abs(loss - ref) / abs(ref)
    ok = math.isfinite(loss) and math.isfinite(gnorm) and loss_rel <= BF16_LOSS_TOL
    return {"status": "PASS" if ok else "FAIL", "tokens_per_s": batch.n_real * args.iters / elapsed,
            "step_s": elapsed / args.iters, "tflops": flops / elapsed / 1e12,
            "mfu": flops / elapsed / (args.peak_tflops * 1e12), "peak_gib": peak_gib(dev),
            "loss_bf16": loss, "loss_fp32": ref, "loss_rel": loss_rel, "tol": BF16_LOSS_TOL,
            "grad_norm": gnorm, "rows": sizes.bf16_rows, "T": sizes.bf16_T,
            "ttt_steps": sizes.steps, "iters": args.iters, "flop_per_step": flops / args.iters}


def tiny_verifiers() -> dict[str, Any]:
    """The extract check's verifiers: HF configs of a 4-layer Llama and of the Kimi-shaped
    DeepSeek-V3 fixture (``tests/kimi_fixture.py``), vocabulary 512."""
    import transformers as tf

    from kimi_fixture import kimi_config

    llama = tf.LlamaConfig(**TINY_LLAMA, tie_word_embeddings=False)
    llama.architectures = ["LlamaForCausalLM"]
    return {"llama": llama, "kimi": kimi_config(512)}


def capture_rows(path: Path, device: str, dtype: str, rows: Any) -> dict[str, torch.Tensor]:
    """The verifier at ``path`` loaded by the extract stage's loader and captured with
    :func:`capture_packed` (fp32 codec), aux ids the default: ``{"aux", "final"}`` on the CPU."""
    from specdraft.core.capture import capture_packed, default_aux_ids, num_layers
    from specdraft.core.storage import CODECS
    from specdraft.core.verifier import load_verifier

    model = load_verifier(path, dtype=dtype, device=device)
    packed = capture_packed(model, rows, default_aux_ids(num_layers(model)), CODECS["fp32"])
    return {"aux": packed.aux[0].double().cpu(), "final": packed.final[0].double().cpu()}


def compare_capture(name: str, path: Path, args: argparse.Namespace, rows: Any
                    ) -> dict[str, Any]:
    """One verifier captured on the device and on the CPU (fp32); the Llama also on the CPU in
    fp64 (transformers' MoE kernels take no fp64). Figures prefixed by ``name``."""
    on = {d: capture_rows(path, d, "float32", rows)
          for d in dict.fromkeys([str(args.device), "cpu"])}
    cpu, dev = on["cpu"], on[str(args.device)]
    out = {f"{name}_rel": max(rel_err(dev[k], cpu[k]) for k in cpu),
           f"{name}_abs_max": max(float((dev[k] - cpu[k]).abs().max()) for k in cpu)}
    if name == "llama":
        ref64 = capture_rows(path, "cpu", "float64", rows)
        out["llama_fp32_vs_fp64"] = max(rel_err(cpu[k], ref64[k]) for k in cpu)
    return out


def check_extract(args: argparse.Namespace) -> dict[str, Any]:
    """Each tiny verifier (:func:`tiny_verifiers`) through :func:`compare_capture`; one that
    raises is a FAIL named ``{name}_error``, the other still compared."""
    from transformers import AutoModelForCausalLM

    from specdraft.core.batching import pad_rows

    g = torch.Generator().manual_seed(2)
    lengths = [40, 33, 17] if args.tiny else [512, 300, 129]
    ids = [torch.randint(0, 510, (n,), generator=g).tolist() for n in lengths]
    masks = [[0] * (n // 3) + [1] * (n - n // 3) for n in lengths]
    rows = pad_rows(ids, masks)
    result: dict[str, Any] = {"status": "PASS", "tol": args.fp32_tol}
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in tiny_verifiers().items():
            torch.manual_seed(0)
            AutoModelForCausalLM.from_config(config).save_pretrained(Path(tmp) / name)
            try:
                result.update(compare_capture(name, Path(tmp) / name, args, rows))
            except Exception as e:  # noqa: BLE001 - the other verifier is still compared
                traceback.print_exc()
                result[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:160]}"
            if not result.get(f"{name}_rel", math.inf) <= args.fp32_tol:
                result["status"] = "FAIL"
    return result


CHECKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "train_h4096_fp32": lambda a: check_fused_vs_split("h4096", a),
    "train_kimi_mla_fp32": lambda a: check_fused_vs_split("kimi", a),
    "extract_cuda_vs_cpu": check_extract,
    "train_h4096_bf16": lambda a: check_bf16("h4096", a),
    "train_kimi_mla_bf16": lambda a: check_bf16("kimi", a),
}


# ------------------------------------------------------------------ driver


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "_".join(str(value).split())  # one token per value: key=value stays parseable


def summary_line(name: str, result: dict[str, Any]) -> str:
    """``gpu_check NAME STATUS key=value ...`` (the error, if any, last and unquoted)."""
    figures = " ".join(f"{k}={fmt(v)}" for k, v in result.items()
                       if k not in ("status", "error", "seconds"))
    line = f"gpu_check {name} {result['status']} {figures} seconds={result['seconds']:.1f}"
    return line + (f" error: {result['error']}" if "error" in result else "")


def run_check(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One check, its exceptions turned into a FAIL line (a traceback on stderr)."""
    reset_peak(args.device)
    t0 = time.perf_counter()
    try:
        result = CHECKS[name](args)
    except Exception as e:  # noqa: BLE001 - a failing check must not stop the others
        traceback.print_exc()
        result = {"status": "FAIL", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    result["seconds"] = time.perf_counter() - t0
    gc.collect()  # the check's drafter and optimizer state, before the next check
    if args.device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__,
           "device": str(device), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        env.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                   capability=".".join(map(str, torch.cuda.get_device_capability(device))))
    return env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (hidden 64): the CPU dry run")
    ap.add_argument("--deadline-s", type=float, default=420.0,
                    help="no check starts after this many seconds (SKIP); default 420 (7 min)")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {list(CHECKS)}")
    ap.add_argument("--iters", type=int, default=5, help="timed bf16 steps per shape")
    ap.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS)
    ap.add_argument("--fp32-tol", type=float, default=FP32_TOL)
    ap.add_argument("--json", default=None, help="also write one JSON object per line here "
                    "(default $OUT/gpu_check.jsonl when OUT is set)")
    ap.add_argument("--plant-fault", choices=["grad"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.device = torch.device(args.device)
    if args.device.type == "cuda":
        if not torch.cuda.is_available():
            ap.error("--device cuda: torch sees no GPU (use --device cpu --tiny for a dry run)")
        args.device = torch.device("cuda", torch.cuda.current_device())
    unknown = set(filter(None, args.only.split(","))) - set(CHECKS)
    if unknown:
        ap.error(f"--only: unknown check(s) {sorted(unknown)}; known: {list(CHECKS)}")
    args.sizes = TINY if args.tiny else FULL
    if args.json is None and os.environ.get("OUT"):
        args.json = str(Path(os.environ["OUT"]) / "gpu_check.jsonl")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the checks; exit status 1 when any check FAILs (SKIP is not a failure)."""
    args = parse_args(argv)
    start = time.perf_counter()
    import transformers

    transformers.utils.logging.disable_progress_bar()  # the extract check's loads: no bars
    torch.set_float32_matmul_precision("highest")  # no TF32 in the fp32 comparisons
    env = environment(args.device)
    print("gpu_check env " + " ".join(f"{k}={fmt(v)}" for k, v in env.items()), flush=True)
    names = [n for n in CHECKS if not args.only or n in args.only.split(",")]
    out = open(args.json, "a") if args.json else None
    failed = False
    for name in names:
        if time.perf_counter() - start > args.deadline_s:
            result = {"status": "SKIP", "error": f"deadline {args.deadline_s:g} s passed",
                      "seconds": 0.0}
        else:
            result = run_check(name, args)
        failed |= result["status"] == "FAIL"
        print(summary_line(name, result), flush=True)
        if out:
            out.write(json.dumps({"check": name, **env, **result}) + "\n")
            out.flush()
    total = time.perf_counter() - start
    print(f"gpu_check done {'FAIL' if failed else 'PASS'} seconds={total:.1f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
