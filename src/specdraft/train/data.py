"""Rows of a hidden-state source -> split, deterministic token-budget plans, padded batches.

The plan of an epoch depends only on (row lengths, settings, seed, epoch), so a resumed run
recomputes it and skips the micro-batches already consumed (the data position is
``(epoch, step_in_epoch)``), and 1 or N ranks see the same global batches:

1. rows shuffled with a generator seeded by ``seed`` and ``epoch``;
2. the shuffled order cut into windows of ``length_window`` rows, each sorted longest first,
   then packed greedily into micro-batches of at most ``batch_tokens`` padded tokens
   (rows × longest row; a longer row forms a micro-batch of its own);
3. the micro-batches shuffled again with the same generator.

Optimizer step ``s`` consumes global micro-batches ``s*G .. s*G+G-1`` (``G = world_size *
grad_accum``); rank ``r`` takes ``s*G + r*grad_accum + i`` for ``i < grad_accum``. The
micro-batches left over at the end of an epoch (fewer than ``G``) are dropped and counted.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch


MicroBatch = tuple[int, ...]


def row_lengths(source: Any) -> list[int]:
    """Token count of every row, without decoding rows when the source knows it:
    ``source.lengths()``, a DiskSource's index (``seq_len``), an OnlineSource's dataset column
    ``seq_len``; otherwise read from the rows themselves (one pass over the source)."""
    if hasattr(source, "lengths"):
        return [int(n) for n in source.lengths()]
    entries = getattr(source, "_entries", None)
    if entries and "seq_len" in entries[0]:
        return [int(e["seq_len"]) for e in entries]
    dataset = getattr(source, "dataset", None)
    if dataset is not None and "seq_len" in getattr(dataset, "column_names", ()):
        return [int(n) for n in dataset["seq_len"]]
    out: list[int] = []
    for start in range(0, len(source), 64):
        rows = source.get_batch(list(range(start, min(start + 64, len(source)))))
        out.extend(int(r.input_ids.numel()) for r in rows)
    return out


def split_indices(keys: Sequence[str], val_fraction: float, seed: int
                  ) -> tuple[list[int], list[int]]:
    """(train, val) row indices; a row is in val iff a hash of ``seed`` and its key falls below
    ``val_fraction`` (stable when rows are added). At least one val row when the fraction is > 0
    and there are two rows or more; never an empty train split."""
    score = [int(hashlib.sha256(f"{seed}:{k}".encode()).hexdigest()[:12], 16) / 16 ** 12
             for k in keys]
    val = [i for i, s in enumerate(score) if s < val_fraction]
    if val_fraction > 0 and not val and len(keys) >= 2:
        val = [min(range(len(keys)), key=score.__getitem__)]
    if len(val) == len(keys):
        val = val[:-1]
    chosen = set(val)
    return [i for i in range(len(keys)) if i not in chosen], val


def pack(order: Sequence[int], lengths: Sequence[int], batch_tokens: int) -> list[MicroBatch]:
    """Greedy micro-batches over ``order`` with ``len(rows) * longest <= batch_tokens``."""
    batches: list[MicroBatch] = []
    rows: list[int] = []
    longest = 0
    for i in order:
        new_longest = max(longest, lengths[i])
        if rows and (len(rows) + 1) * new_longest > batch_tokens:
            batches.append(tuple(rows))
            rows, new_longest = [], lengths[i]
        rows.append(i)
        longest = new_longest
    if rows:
        batches.append(tuple(rows))
    return batches


def plan_epoch(indices: Sequence[int], lengths: Sequence[int], *, batch_tokens: int,
               length_window: int, seed: int, epoch: int) -> list[MicroBatch]:
    """The micro-batches of one training epoch (see the module docstring)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = [indices[i] for i in torch.randperm(len(indices), generator=g).tolist()]
    batches: list[MicroBatch] = []
    for w in range(0, len(order), length_window):
        window = sorted(order[w: w + length_window], key=lambda i: -lengths[i])
        batches.extend(pack(window, lengths, batch_tokens))
    return [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]


def plan_eval(indices: Sequence[int], lengths: Sequence[int], batch_tokens: int
              ) -> list[MicroBatch]:
    """Validation micro-batches: rows longest first, packed greedily (no shuffling)."""
    return pack(sorted(indices, key=lambda i: (-lengths[i], i)), lengths, batch_tokens)


def rank_micro_batches(plan: Sequence[MicroBatch], step_in_epoch: int, rank: int,
                       world_size: int, grad_accum: int) -> list[MicroBatch]:
    """The ``grad_accum`` micro-batches of ``rank`` for optimizer step ``step_in_epoch``."""
    start = (step_in_epoch * world_size + rank) * grad_accum
    return list(plan[start: start + grad_accum])
