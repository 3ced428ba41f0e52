"""Next-token targets from a prepared row: the one alignment rule every later stage uses.

The drafter at position ``p`` predicts token ``p + 1``. A position is supervised iff the token it
predicts is supervised: ``supervised[p] = loss_mask[p + 1] == 1``; the last position has no next
token and is never supervised. (EAGLE-3 trains on the verifier's next-token distribution at the
same positions; docs/run-dir.md: ``final_hidden`` is stored at the positions with
``loss_mask[p+1] == 1``.)
"""

from __future__ import annotations

from typing import Any

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index


def next_token_targets(input_ids: Any, loss_mask: Any, *,
                       ignore_index: int = IGNORE_INDEX) -> tuple[Any, Any]:
    """``(labels, supervised)`` for ``input_ids`` and ``loss_mask`` of shape [..., T].

    - ``labels`` [..., T], dtype of ``input_ids``: ``labels[..., p] = input_ids[..., p + 1]``;
      the last position holds ``ignore_index``.
    - ``supervised`` [..., T] bool: ``loss_mask[..., p + 1] == 1``; False at the last position.

    Works on torch tensors and numpy arrays alike. Raises ValueError when shapes differ.
    """
    if tuple(input_ids.shape) != tuple(loss_mask.shape):
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and loss_mask "
                         f"{tuple(loss_mask.shape)} differ in shape")
    labels = input_ids.clone() if hasattr(input_ids, "clone") else input_ids.copy()  # [..., T]
    labels[..., :-1] = input_ids[..., 1:]
    labels[..., -1] = ignore_index
    supervised = loss_mask == 1                                                      # [..., T]
    supervised = supervised.clone() if hasattr(supervised, "clone") else supervised.copy()
    supervised[..., :-1] = loss_mask[..., 1:] == 1
    supervised[..., -1] = False
    return labels, supervised
