"""The conventions every stage shares, each defined once here and called by every stage.

- **Supervised positions.** The drafter at position ``p`` predicts token ``p + 1``; a position is
  supervised iff the token it predicts is: ``loss_mask[p + 1] == 1``. The last position has no
  next token and is never supervised. EAGLE-3 trains on the verifier's next-token distribution at
  the same positions (arXiv 2503.01840, §3), so ``extract`` stores the final hidden state at
  exactly these positions and ``train`` checks that it did.
- **Draft vocabulary maps.** ``d2t`` ``[K]`` int64 holds offsets: ``target = draft + d2t[draft]``
  (vLLM ``model_executor/models/llama_eagle3.py`` scatters draft logits to
  ``arange(K) + d2t``; SGLang turns it into hot token ids the same way); ``t2d`` ``[V]`` bool
  marks the K target ids (training only; both engines skip it at load).
"""

from __future__ import annotations

from typing import Any

import numpy as np

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index


def supervised_mask(loss_mask: Any) -> Any:
    """Bool ``[..., T]``: ``loss_mask[..., p + 1] == 1``; False at the last position.

    ``loss_mask`` ``[..., T]`` (0/1, 0 on padding) as a torch tensor or numpy array; the result
    has the same kind and device.
    """
    if hasattr(loss_mask, "new_zeros"):  # torch
        out = loss_mask.new_zeros(loss_mask.shape).bool()
    else:
        out = np.zeros(loss_mask.shape, dtype=bool)
    out[..., :-1] = loss_mask[..., 1:] == 1
    return out


def supervised_positions(loss_mask: Any) -> Any:
    """``[n_sup]`` int64 torch tensor, ascending: the ``p`` with ``loss_mask[p + 1] == 1`` for a
    ``[T]`` torch mask."""
    import torch

    return torch.nonzero(supervised_mask(loss_mask), as_tuple=False).flatten().to(torch.int64)


def next_token_targets(input_ids: Any, loss_mask: Any, *,
                       ignore_index: int = IGNORE_INDEX) -> tuple[Any, Any]:
    """``(labels, supervised)`` for ``input_ids`` and ``loss_mask`` of shape ``[..., T]``.

    - ``labels`` ``[..., T]``, dtype of ``input_ids``: ``labels[..., p] = input_ids[..., p + 1]``;
      the last position holds ``ignore_index``.
    - ``supervised`` ``[..., T]`` bool: :func:`supervised_mask`.

    Works on torch tensors and numpy arrays alike. Raises ValueError when shapes differ.
    """
    if tuple(input_ids.shape) != tuple(loss_mask.shape):
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and loss_mask "
                         f"{tuple(loss_mask.shape)} differ in shape")
    labels = input_ids.clone() if hasattr(input_ids, "clone") else input_ids.copy()  # [..., T]
    labels[..., :-1] = input_ids[..., 1:]
    labels[..., -1] = ignore_index
    return labels, supervised_mask(loss_mask)


def vocab_map_problems(d2t: Any, t2d: Any, K: int | None = None,
                       V: int | None = None) -> list[str]:
    """What is wrong with a ``(d2t [K], t2d [V])`` pair, empty when nothing is.

    The contract: ``arange(K) + d2t`` strictly increasing inside ``[0, V)`` (distinct, sorted
    target ids) and ``t2d`` True exactly at those ids (``t2d.sum() == K``). ``K``/``V``, when
    given, are the sizes the pair must have (the drafter's ``draft_vocab_size`` and
    ``vocab_size``). Accepts torch tensors or numpy arrays.
    """
    if d2t is None or t2d is None:
        return [f"{'d2t' if d2t is None else 't2d'} absent: the engines cannot map draft ids "
                f"to verifier ids (vLLM scatters logits to arange(K) + d2t)"]
    d2t = np.asarray(d2t.cpu() if hasattr(d2t, "cpu") else d2t).astype(np.int64)
    t2d = np.asarray(t2d.cpu() if hasattr(t2d, "cpu") else t2d).astype(bool)
    K = len(d2t) if K is None else K
    V = len(t2d) if V is None else V
    if d2t.shape != (K,) or t2d.shape != (V,):
        return [f"d2t shape {list(d2t.shape)} / t2d shape {list(t2d.shape)}: expected [{K}] "
                f"and [{V}]"]
    problems: list[str] = []
    target = np.arange(K, dtype=np.int64) + d2t  # [K]
    if K > 1 and np.any(np.diff(target) <= 0):
        problems.append("arange(K) + d2t is not strictly increasing (duplicate or unsorted "
                        "target ids)")
    if K and (target.min() < 0 or target.max() >= V):
        problems.append(f"arange(K) + d2t leaves [0, {V}): min {int(target.min())}, "
                        f"max {int(target.max())}")
    if int(t2d.sum()) != K:
        problems.append(f"t2d has {int(t2d.sum())} true entries, expected draft vocab {K}")
    inside = target[(target >= 0) & (target < V)]
    if not t2d[inside].all():
        problems.append("t2d and d2t disagree: some arange(K) + d2t ids are false in t2d")
    return problems
