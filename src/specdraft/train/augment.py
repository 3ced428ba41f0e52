"""Training-only augmentation of the verifier's aux hidden states.

One setting, ``TrainConfig.hidden_noise`` (σ): each aux layer's state ``x`` [H] at a row's
position gets ``x + σ · rms(x) · ε``, ε ~ N(0, I). Scaled by the vector's own RMS so that σ means
the same for every aux layer (their scales differ by orders of magnitude) and for every verifier,
and so that with the EAGLE-3.1 norms before ``fc`` it is noise of size σ after the norm.

Why: a drafter trained for several epochs on a few thousand answers memorises them (on the
quality rows of docs/benchmarks.md the training τ̂ reaches 3.4 while validation stays at 2.7).
EAGLE's training (arXiv 2401.15077; SafeAILab/EAGLE's dataset transform) adds uniform noise to
the hidden states it trains on; this is a scale-free Gaussian form of that idea, not its code.

Determinism: the noise of row ``r`` at step ``s`` comes from a generator seeded by
``(seed, s, r)`` and covers the row's own positions only, so it does not depend on which
micro-batch, rank or padded length the row lands in (one process equals DDP) and a resumed
run draws what the uninterrupted one drew.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: spreads (seed, step, row) over the seed space


def row_generator(seed: int, step: int, row: int) -> torch.Generator:
    """A CPU generator seeded by ``(seed, step, row)`` alone."""
    key = (seed * _MIX + step) * _MIX + row
    return torch.Generator().manual_seed(key & 0x7FFF_FFFF_FFFF_FFFF)


def noised_aux_hidden(aux: torch.Tensor, rows: Sequence[int], lengths: Sequence[int],
                      n_aux: int, sigma: float, seed: int, step: int) -> torch.Tensor:
    """``aux`` with per-layer relative Gaussian noise on each row's real positions.

    aux [B, T, n_aux*H] float (a right-padded micro-batch, ``TrainBatch.aux_hidden``); rows:
    the B row ids in batch order; lengths: their token counts (≤ T). Returns a new tensor of
    ``aux``'s shape, dtype and device: at row b, position t < lengths[b], aux layer j,
    ``x + sigma * rms(x) * eps`` with ``rms(x) = sqrt(mean(x**2))`` over that layer's H
    features and ``eps`` [H] standard normal from :func:`row_generator` ``(seed, step,
    rows[b])``; padding untouched. ``sigma == 0`` returns ``aux`` itself.

    Raises ValueError when ``rows``/``lengths`` do not match the batch, a length exceeds T,
    or the last dimension is not divisible by ``n_aux``.
    """
    if sigma == 0:
        return aux
    B, T, D = aux.shape
    if len(rows) != B or len(lengths) != B:
        raise ValueError(f"noised_aux_hidden: {len(rows)} rows / {len(lengths)} lengths for a "
                         f"batch of {B}")
    if D % n_aux:
        raise ValueError(f"noised_aux_hidden: last dim {D} is not {n_aux} aux layers")
    eps = torch.zeros(B, T, D, dtype=torch.float32)
    for b, (row, n) in enumerate(zip(rows, lengths)):
        if n > T:
            raise ValueError(f"noised_aux_hidden: row {row} has {n} tokens, batch has {T}")
        eps[b, :n] = torch.randn(n, D, generator=row_generator(seed, step, row))
    H = D // n_aux
    x = aux.float().view(B, T, n_aux, H)
    rms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # sqrt(H) * rms(x)
    out = torch.addcmul(x, rms, eps.to(aux.device).view(B, T, n_aux, H),
                        value=sigma / math.sqrt(H))
    return out.view(B, T, D).to(aux.dtype)
