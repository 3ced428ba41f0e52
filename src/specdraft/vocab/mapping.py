"""Pure functions of the draft vocabulary: counting, selection, and the ``d2t``/``t2d`` maps.

Convention (EAGLE-3, as loaded by vLLM ``llama_eagle3.py`` and SGLang ``llama_eagle3.py``):
``d2t`` int64 [K] holds offsets, ``target_id = draft_id + d2t[draft_id]``; ``t2d`` bool [V] is
True at the target ids in the draft vocabulary. Draft ids are the selected target ids in
increasing order, so ``d2t`` is non-decreasing and targets strictly increase.
"""

from __future__ import annotations

import numpy as np

from specdraft.core.conventions import vocab_map_problems


def count_supervised(input_ids: np.ndarray, loss_mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """Counts [V] int64 of the token ids where ``loss_mask == 1``.

    ``input_ids``, ``loss_mask``: flat [N] arrays (all rows concatenated). Raises ValueError
    for an id outside [0, V).
    """
    ids = np.asarray(input_ids, dtype=np.int64)[np.asarray(loss_mask) == 1]  # [n_sup]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token id {int(ids.max())} outside the verifier vocabulary "
                         f"[0, {vocab_size})")
    return np.bincount(ids, minlength=vocab_size).astype(np.int64)          # [V]


def select_ids(counts: np.ndarray, k: int, forced: list[int] | np.ndarray) -> np.ndarray:
    """The K target ids of the draft vocabulary, sorted ascending (int64 [K']).

    ``forced`` ids are always in; the rest are the most frequent ids (count > 0), ties by lower
    id; when fewer than K ids were seen, the lowest unused ids fill the remainder, so the result
    has exactly ``min(K, V)`` ids and depends only on ``counts``, ``k`` and ``forced``. K >= V
    returns every id. Raises ValueError when there are more forced ids than K.
    """
    v = len(counts)
    if k >= v:
        return np.arange(v, dtype=np.int64)
    chosen = np.zeros(v, dtype=bool)                                   # [V]
    forced = np.unique(np.asarray(forced, dtype=np.int64))
    forced = forced[(forced >= 0) & (forced < v)]
    if len(forced) > k:
        raise ValueError(f"{len(forced)} always-kept tokens exceed --draft-vocab-size {k}")
    chosen[forced] = True
    order = np.lexsort((np.arange(v), -counts))                        # by count desc, id asc
    ranked = order[(counts[order] > 0) & ~chosen[order]]
    chosen[ranked[:k - len(forced)]] = True
    missing = k - int(chosen.sum())
    if missing > 0:
        chosen[np.flatnonzero(~chosen)[:missing]] = True
    return np.flatnonzero(chosen).astype(np.int64)


def build_maps(selected: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(d2t int64 [K], t2d bool [V])`` for sorted target ids ``selected`` [K]."""
    selected = np.asarray(selected, dtype=np.int64)
    d2t = selected - np.arange(len(selected), dtype=np.int64)          # [K]
    t2d = np.zeros(vocab_size, dtype=bool)                             # [V]
    t2d[selected] = True
    validate_maps(d2t, t2d)
    return d2t, t2d


def validate_maps(d2t: np.ndarray, t2d: np.ndarray) -> None:
    """Raise ValueError unless targets ``arange(K) + d2t`` strictly increase inside [0, V),
    ``t2d.sum() == K`` and ``t2d`` is True exactly at those targets."""
    problems = vocab_map_problems(d2t, t2d)
    if problems:
        raise ValueError("; ".join(problems))


def coverage(counts: np.ndarray, t2d: np.ndarray) -> float:
    """Share of supervised tokens whose id is in the draft vocabulary (1.0 when none)."""
    total = int(counts.sum())
    return float(counts[t2d].sum()) / total if total else 1.0


def top_left_out(counts: np.ndarray, t2d: np.ndarray, n: int) -> list[tuple[int, int]]:
    """The ``n`` most frequent excluded ids as ``(id, count)``, count desc then id asc."""
    out = np.flatnonzero(~t2d & (counts > 0))
    order = np.lexsort((out, -counts[out]))[:n]
    return [(int(out[i]), int(counts[out[i]])) for i in order]
