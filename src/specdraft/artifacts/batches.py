"""Stored rows (:mod:`specdraft.artifacts.hidden_states`) -> training batches: the right-padded
:class:`TrainBatch` and the verifier targets, the soft distribution over the draft vocabulary and
the greedy label (``target = draft + d2t[draft]``, :mod:`specdraft.core.conventions`).

Shared by ``train`` (every micro-batch) and the teacher check (``train`` before its first step,
``doctor``): one computation of what the drafter is taught.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Sequence

import torch

from specdraft.core.conventions import supervised_positions
from specdraft.core.errors import InputError


@dataclass
class TrainBatch:
    """A right-padded micro-batch; ``p`` indexes positions of the verifier's sequence.

    input_ids [B, T] int64 (pad 0); aux_hidden [B, T, n_aux*Ht] float32; sup [B, T] bool
    (``loss_mask[p+1] == 1``); target_probs [N, K] float32, N = ``sup.sum()``: the restricted
    verifier distribution at each supervised position, packed in ``sup.nonzero()`` order
    (row-major; ``probs_dense[sup]``); label [B, T] int64 (draft id of the verifier's greedy
    token at ``p``; -1 where unsupervised or outside the draft vocabulary); n_real: real
    (unpadded) tokens. Packed because a [B, T, K] tensor would be mostly zeros to fill and,
    per TTT step, a [N, K] gather to read; packed, a step reads a slice (``forward``).
    verifier_token [B, T] int64: the verifier's argmax over its full vocabulary at ``p`` (a
    target id, in or out of the draft vocabulary; -1 where unsupervised); final_hidden [N, H]
    float32: the verifier's final (post-norm) states, packed as ``target_probs``, only when the
    collator keeps them (``keep_final_hidden``: a full-vocabulary teacher, DFlash's soft labels).
    """

    input_ids: torch.Tensor
    aux_hidden: torch.Tensor
    sup: torch.Tensor
    target_probs: torch.Tensor
    label: torch.Tensor
    n_real: int
    verifier_token: torch.Tensor | None = None
    final_hidden: torch.Tensor | None = None

    def dense_probs(self) -> torch.Tensor:
        """``target_probs`` unpacked to [B, T, K] (zeros where not supervised)."""
        out = self.target_probs.new_zeros(*self.sup.shape, self.target_probs.shape[-1])
        out[self.sup] = self.target_probs
        return out

    def to(self, device: torch.device | str) -> "TrainBatch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device, non_blocking=True)
        return TrainBatch(**moved)


@torch.no_grad()
def verifier_targets(final_hidden: torch.Tensor, lm_head: torch.Tensor, draft_ids: torch.Tensor,
                     t2d_index: torch.Tensor, chunk: int = 1024, *, with_argmax: bool = False,
                     argmax: torch.Tensor | None = None, draft_head: torch.Tensor | None = None,
                     with_probs: bool = True) -> tuple[torch.Tensor, ...]:
    """Soft targets and labels from the verifier's final hidden states.

    final_hidden [N, H] (after the verifier's final norm), lm_head [V, H], draft_ids [K] int64
    (target id of each draft id: ``arange(K) + d2t``), t2d_index [V] int64 (draft id or -1).
    Returns probs [N, K] float32 (softmax over the draft vocab) and label [N] int64 (draft id of
    the argmax over the full vocab, -1 when outside the draft vocab). fp32, chunked over N:
    peak ``chunk·V·4`` bytes for the logits, whatever N (``benchmarks/bench_scale.py``).
    ``with_argmax``: also the argmax itself [N] int64 (a target id, whatever the draft vocab).

    The probs always come from the draft rows of the head alone (``draft_head`` [K, H] =
    ``lm_head[draft_ids]``, gathered here when not given): ``[n, H] x [H, K]``. The full
    vocabulary's ``[n, H] x [H, V]`` is computed only for the argmax, and not at all when
    ``argmax`` [N] (the same rows' argmax from an earlier call: :class:`Collator`'s cache) is
    given; the result is the same bit for bit either way. With a 49k verifier vocab and 8k draft
    vocab that is 6x fewer multiply-adds per epoch after the first (162k / 32k for Kimi-K2.5).
    ``with_probs=False`` (an objective that reads only the labels: DFlash's) skips the probs too:
    they come back as [N, 0]. Raises ValueError when ``argmax`` does not have N entries.
    """
    if argmax is not None and argmax.numel() != final_hidden.shape[0]:
        raise ValueError(f"argmax has {argmax.numel()} entries for {final_hidden.shape[0]} "
                         f"positions")
    head = lm_head.float()
    rows = head[draft_ids] if draft_head is None else draft_head.float()
    rows = rows if with_probs else rows[:0]  # [0, H]: [n, 0] probs, no softmax work
    probs, tops = [], []
    for part in final_hidden.float().split(chunk):
        if argmax is None:
            full = part @ head.T  # [n, V]
            tops.append(full.max(-1).indices)  # = argmax (first index on ties), 2-3x faster on CPU
            del full  # else the next chunk's [n, V] is allocated while this one is alive
        probs.append(torch.softmax(part @ rows.T, dim=-1))  # [n, K]
    top = torch.cat(tops) if argmax is None else argmax.to(t2d_index.device, torch.long)
    out = torch.cat(probs), t2d_index[top]
    return (*out, top) if with_argmax else out


def check_row(row: Any) -> None:
    """Raise :class:`InputError` naming ``row.key`` when its tensors disagree with the contract
    (shapes, and ``target_positions`` = the ``p`` with ``loss_mask[p+1] == 1``)."""
    T = row.input_ids.numel()
    if row.loss_mask.shape != (T,) or row.aux_hidden.shape[0] != T:
        raise InputError(f"row {row.key}: input_ids [{T}] but loss_mask "
                         f"{list(row.loss_mask.shape)}, aux_hidden {list(row.aux_hidden.shape)}")
    want = supervised_positions(row.loss_mask)
    got = row.target_positions.to(torch.long)
    if not torch.equal(got.cpu(), want.cpu()) or row.final_hidden.shape[0] != got.numel():
        raise InputError(f"row {row.key}: target_positions/final_hidden "
                         f"({got.numel()}/{row.final_hidden.shape[0]}) do not match the "
                         f"positions p with loss_mask[p+1] == 1 ({want.numel()})")


class Collator:
    """Rows -> a right-padded :class:`TrainBatch` with the verifier targets computed.

    head: the verifier's ``lm_head.weight`` [V, H]; d2t [K] int64 (``target = draft + d2t``).
    Targets are computed on ``device`` (fp32) and the batch is returned there.
    ``keep_final_hidden``: also keep the rows' final states in the batch (``final_hidden``).
    ``cache_argmax``: keep each row's full-vocabulary argmax (int32 on the CPU, 4 bytes per
    supervised position), keyed by ``row.key``, so that later epochs skip the ``[n, H] x [H, V]``
    logits (:func:`verifier_targets`); only for rows whose final states never change (stored
    hidden states, not a live capture). ``with_probs=False``: ``target_probs`` is [N, 0] (the
    objective reads only the labels: ``needs_target_probs`` of DFlash's objective).
    """

    def __init__(self, lm_head: torch.Tensor, d2t: torch.Tensor, device: torch.device, *,
                 keep_final_hidden: bool = False, cache_argmax: bool = False,
                 with_probs: bool = True) -> None:
        self.device = device
        self.with_probs = with_probs
        self.keep_final_hidden = keep_final_hidden
        self.argmax_cache: dict[str, torch.Tensor] | None = {} if cache_argmax else None
        self.lm_head = lm_head.to(device, torch.float32)
        self.draft_ids = (torch.arange(d2t.numel()) + d2t).to(device)  # [K] target ids
        self.draft_head = self.lm_head[self.draft_ids]  # [K, H]
        V = lm_head.shape[0]
        self.t2d_index = torch.full((V,), -1, dtype=torch.long, device=device)
        self.t2d_index[self.draft_ids] = torch.arange(d2t.numel(), device=device)

    def __call__(self, rows: Sequence[Any]) -> TrainBatch:
        for row in rows:
            check_row(row)
        B, T = len(rows), max(r.input_ids.numel() for r in rows)
        width = rows[0].aux_hidden.shape[1]
        ids = torch.zeros(B, T, dtype=torch.long)
        aux = torch.zeros(B, T, width, dtype=torch.float32)
        sup = torch.zeros(B, T, dtype=torch.bool)
        probs = []  # [n_b, K] per row; positions ascend (check_row): TrainBatch's packed order
        label = torch.full((B, T), -1, dtype=torch.long, device=self.device)
        top = torch.full((B, T), -1, dtype=torch.long, device=self.device)
        finals = []
        for b, r in enumerate(rows):
            n = r.input_ids.numel()
            ids[b, :n] = r.input_ids
            aux[b, :n] = r.aux_hidden.float()
            pos = r.target_positions.long()
            sup[b, pos] = True
            final = r.final_hidden.to(self.device)
            cached = None if self.argmax_cache is None else self.argmax_cache.get(r.key)
            p, lab, arg = verifier_targets(final, self.lm_head, self.draft_ids, self.t2d_index,
                                           with_argmax=True, argmax=cached,
                                           draft_head=self.draft_head,
                                           with_probs=self.with_probs)
            if self.argmax_cache is not None and cached is None:
                self.argmax_cache[r.key] = arg.to("cpu", torch.int32)
            probs.append(p)
            label[b, pos.to(self.device)] = lab
            top[b, pos.to(self.device)] = arg
            if self.keep_final_hidden:
                finals.append(final.float())
        n_real = sum(r.input_ids.numel() for r in rows)
        packed = torch.cat(probs)  # rows is never empty: rows[0] above
        final_hidden = torch.cat(finals) if finals else None
        return TrainBatch(ids, aux, sup, packed, label, n_real, top,
                          final_hidden).to(self.device)
