"""Length-sorted token-budget batches, right padding, and the deterministic work plan.

Right padding with an attention mask and explicit position ids ``0..len-1`` changes no value at
a real position: under a causal mask a real token attends only to earlier (real) tokens, and its
rotary position is its index in the row. The test compares every stored tensor with a
one-sample-at-a-time reference.

The plan depends only on the row lengths and the settings, so a resumed run and a run with a
different number of ranks compute exactly the same batches (bit-identical values):

1. rows sorted by length, longest first (an out-of-memory shows up in the first batch), ties by
   dataset order;
2. batches filled greedily while ``rows * longest_len <= batch_tokens`` (a row longer than the
   budget forms a batch on its own);
3. batch ``b`` goes to rank ``b % world_size``;
4. each rank groups its rows, in processing order, into shards of at most ``shard_bytes``
   (uncompressed estimate; a single larger row gets a shard of its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class Batch:
    """One forward: dataset row indices (longest first) and the padded length ``T``."""

    rows: tuple[int, ...]
    max_len: int


def plan_batches(seq_lens: Sequence[int], batch_tokens: int) -> list[Batch]:
    """Greedy length-sorted batches with ``len(rows) * max_len <= batch_tokens`` (padded tokens)."""
    order = sorted(range(len(seq_lens)), key=lambda i: (-seq_lens[i], i))
    batches: list[Batch] = []
    rows: list[int] = []
    for i in order:
        longest = seq_lens[rows[0]] if rows else seq_lens[i]
        if rows and (len(rows) + 1) * longest > batch_tokens:
            batches.append(Batch(tuple(rows), longest))
            rows = []
        rows.append(i)
    if rows:
        batches.append(Batch(tuple(rows), seq_lens[rows[0]]))
    return batches


def rank_batches(batches: Sequence[Batch], rank: int, world_size: int) -> list[Batch]:
    """The disjoint slice of batches of ``rank``: batch ``b`` goes to rank ``b % world_size``."""
    return list(batches[rank::world_size])


def plan_shards(rows: Sequence[int], row_bytes: Sequence[int], shard_bytes: int
                ) -> list[list[int]]:
    """Group ``rows`` (in processing order) into shards of at most ``shard_bytes`` bytes.

    ``row_bytes[k]`` is the size of ``rows[k]``. A shard holds at least one row.
    """
    shards: list[list[int]] = []
    current: list[int] = []
    size = 0
    for row, nbytes in zip(rows, row_bytes):
        if current and size + nbytes > shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(row)
        size += nbytes
    if current:
        shards.append(current)
    return shards


@dataclass
class Padded:
    """A right-padded batch. All tensors ``[B, T]``; ``lengths`` ``[B]`` int64."""

    input_ids: torch.Tensor       # [B, T] int64, pad id 0
    attention_mask: torch.Tensor  # [B, T] int64, 1 on real tokens
    position_ids: torch.Tensor    # [B, T] int64, arange(T) per row
    loss_mask: torch.Tensor       # [B, T] uint8, 0 on padding
    lengths: torch.Tensor         # [B] int64


def pad_rows(input_ids: Sequence[Sequence[int]], loss_mask: Sequence[Sequence[int]]) -> Padded:
    """Right-pad rows to the longest one (``T``); position ids are ``0..T-1`` in every row."""
    lengths = torch.tensor([len(r) for r in input_ids], dtype=torch.int64)
    B, T = len(input_ids), int(lengths.max())
    ids = torch.zeros(B, T, dtype=torch.int64)
    mask = torch.zeros(B, T, dtype=torch.uint8)
    for b, (r, m) in enumerate(zip(input_ids, loss_mask)):
        ids[b, :len(r)] = torch.as_tensor(r, dtype=torch.int64)
        mask[b, :len(m)] = torch.as_tensor(m, dtype=torch.uint8)
    attention = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.int64)  # [B, T]
    positions = torch.arange(T, dtype=torch.int64).expand(B, T).contiguous()  # [B, T]
    return Padded(ids, attention, positions, mask, lengths)
