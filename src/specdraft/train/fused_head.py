"""The draft-vocab head and its soft cross-entropy in one pass, a chunk of rows at a time.

The plain path (``TTTObjective.step_loss`` after ``Eagle3DraftModel.logits``) materialises the
logits ``[N, K]`` of every supervised column, casts them to float32, takes ``log_softmax``,
multiplies by the teacher, and autograd keeps those ``[N, K]`` tensors for a backward that
walks them again. At a draft vocabulary of 8,192 (SmolLM2's quality rows) that is about a
third of a training step on the CPU, all of it memory traffic; at 32,000 draft ids the kept
float32 log-softmax is 128 KB per supervised position and TTT step.

:func:`head_soft_ce` runs the head as one matmul in the compute dtype (``z = x W^T``, bf16
under autocast), then, a chunk of ``chunk`` rows at a time in float32 while the chunk is in
cache: the per-column loss ``lse(z) * sum(p) - p . z`` (``= -sum_j p_j log softmax(z)_j`` for
any ``p``), the greedy draft ``argmax z`` and, when a gradient is wanted, ``dL/dz = w (sum(p)
softmax(z) - p)`` written back in the compute dtype. Autograd keeps only that ``dL/dz`` and
the compute-dtype input (``[N, K]`` and ``[N, H]``, bf16 under autocast: 2 bytes per logit
kept, against the plain path's 4 for its float32 log-softmax, and none of its transient
float32 copies of the logits); the backward runs the two matmuls ``dL/dx = dL/dz W`` and
``dL/dW = (dL/dz)^T x``, as the plain path's would. This is the fused linear-cross-entropy
idea (the loss's gradient taken in the forward, chunked; e.g. Liger-Kernel's
``FusedLinearCrossEntropy``), written here for a soft target and the hit counts.

Measured (``benchmarks/bench_train.py``, its plain and fused heads, CPU, bf16 autocast, one
thread, 2026-12-06, side by side in one run but beside other work, so the time ratios are
rough): draft vocab 8,192, 8 rows, TTT 4: 1.1x faster steps (1.08x-1.17x alone on 2
threads); draft vocab 32,000, one 2,048-token row, TTT 7: 3.2x faster, peak RSS 2.8 GiB
instead of 3.7.
"""

from __future__ import annotations

from typing import Any

import torch

# rows per float32 chunk: on the CPU [128, 8192] = 4 MiB, a cache-sized piece (64 to 256 were
# equal, 4,096 1.13x slower: benchmarks/bench_train.py, 2026-12-06); elsewhere fewer, larger kernel
# launches ([2048, 32000] = 250 MiB; not measured on a GPU yet)
CHUNK_CPU, CHUNK_OTHER = 128, 2048


class _HeadSoftCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, probs: torch.Tensor,
                w: torch.Tensor, dtype: torch.dtype, chunk: int):
        n = x.shape[0]
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        per_col = torch.empty(n, dtype=torch.float32, device=x.device)  # [N]
        top = torch.empty(n, dtype=torch.long, device=x.device)  # [N]
        xb, wb = x.to(dtype), weight.to(dtype)  # [N, H], [K, H]
        logits = xb @ wb.T  # [N, K] in the compute dtype, one matmul
        grad = torch.empty_like(logits) if need_x or need_w else None  # dL/dz [N, K]
        for s in range(0, n, chunk):  # the float32 work a cache-sized chunk at a time
            z = logits[s: s + chunk].float()  # [C, K]
            p = probs[s: s + chunk].float()  # [C, K]
            mass = p.sum(-1)  # [C]
            lse = torch.logsumexp(z, -1)  # [C]
            per_col[s: s + chunk] = lse * mass - (p * z).sum(-1)
            top[s: s + chunk] = z.max(-1).indices  # argmax's first index on ties
            if grad is not None:  # w (sum(p) softmax(z) - p)
                g = z.sub_(lse[:, None]).exp_().mul_(mass[:, None]).sub_(p)
                grad[s: s + chunk] = g.mul_(w[s: s + chunk, None].float())
        del logits
        ctx.save_for_backward(grad, xb, weight)
        ctx.dtype, ctx.x_dtype = dtype, x.dtype
        ctx.mark_non_differentiable(per_col, top)
        loss = (per_col * w.float()).sum()
        return loss, per_col, top

    @staticmethod
    def backward(ctx: Any, g_loss: torch.Tensor, _g_col: Any, _g_top: Any):
        grad, xb, weight = ctx.saved_tensors  # [N, K] and [N, H] compute dtype, [K, H]
        one = g_loss.device.type == "cpu" and g_loss.item() == 1.0  # loss.backward(): no pass
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = (grad @ weight.to(ctx.dtype)).to(ctx.x_dtype)  # [N, H]
            dx = dx if one else dx * g_loss
        if ctx.needs_input_grad[1]:
            dw = (grad.T @ xb).to(weight.dtype)  # [K, H]
            dw = dw if one else dw * g_loss
        return dx, dw, None, None, None, None


def head_soft_ce(x: torch.Tensor, weight: torch.Tensor, probs: torch.Tensor, w: torch.Tensor,
                 *, chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Soft cross-entropy of the head ``x @ weight.T`` against ``probs``, weighted per column.

    x [N, H] float (the normed hidden states; gradients flow to it), weight [K, H] float (the
    draft ``lm_head``; gradients flow to it unless it does not require one), probs [N, K]
    float (the teacher; no gradient), w [N] float (each column's loss weight: the loss mask
    times the step's scale; no gradient); ``chunk``: rows per float32 chunk (none:
    ``CHUNK_CPU`` on the CPU, ``CHUNK_OTHER`` elsewhere). The matmuls run in the autocast
    dtype when autocast is on for ``x``'s device (as ``nn.Linear`` would), else in ``x``'s
    dtype; the softmax and the loss in float32.

    Returns ``(loss, per_col, top)``: ``loss`` = ``sum_n w_n per_col_n`` (scalar float32, the
    only differentiable output), ``per_col`` [N] float32 = ``-sum_j probs_nj log
    softmax(z_n)_j`` (detached), ``top`` [N] long = ``argmax_j z_nj`` (the first on ties).
    Equal to ``-(probs * log_softmax(lm_head(x).float())).sum(-1)`` and its gradients up to
    float rounding (``tests/train/test_fused_head.py``). Raises ValueError on mismatched
    shapes.
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"head_soft_ce: x {tuple(x.shape)} and weight {tuple(weight.shape)} "
                         "must be [N, H] and [K, H]")
    if probs.shape != (x.shape[0], weight.shape[0]) or w.shape != (x.shape[0],):
        raise ValueError(f"head_soft_ce: probs {tuple(probs.shape)} must be [N, K] = "
                         f"[{x.shape[0]}, {weight.shape[0]}] and w {tuple(w.shape)} [N]")
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(
        x.device.type) else x.dtype
    chunk = chunk or (CHUNK_CPU if x.device.type == "cpu" else CHUNK_OTHER)
    with torch.autocast(x.device.type, enabled=False):
        return _HeadSoftCE.apply(x, weight, probs.detach(), w.detach(), dtype, chunk)
