"""The training-time-test (TTT) objective of EAGLE-3 (arXiv 2503.01840, Sec. 3.2).

Alignment. A row has tokens ``x_0..x_{T-1}``, the verifier's aux features ``f_t`` at every
position, and the verifier's next-token distribution ``P_p = P(x_{p+1} | x_{<=p})`` at the
supervised positions ``p`` (those with ``loss_mask[p+1] == 1``). The drafter runs on the
``L = T-1`` columns ``t = 0..T-2``:

- step 0, column ``t``: feature ``h = fc(f_t)``, token embedding of ``x_{t+1}``, rotary
  position ``t``; it predicts ``x_{t+2}``; target ``P_{t+1}``; supervised iff
  ``loss_mask[t+2] == 1``.
- step k, column ``t``: ``h`` = the prenorm output of step k-1 at column ``t``, token
  ``x_{t+1+k}`` (teacher-forced), position ``t+k``; predicts ``x_{t+2+k}``; target
  ``P_{t+1+k}``; supervised iff ``loss_mask[t+2+k] == 1``.

Worked example, T = 6, prompt ``x_0..x_2``, completion ``x_3..x_5``, so
``loss_mask = [0,0,0,1,1,1]`` and ``sup[p] = loss_mask[p+1] = [0,0,1,1,1,0]``:
step 0 has columns 0..4; column 1 embeds ``x_2`` and predicts ``x_3`` from ``P_2``
(supervised), column 0 predicts ``x_2`` (prompt: not supervised), column 4 would predict
``x_6`` (absent: not supervised). Step 1, column 1 embeds ``x_3`` at position 2, predicts ``x_4``
from ``P_3``; step 2, column 1 embeds ``x_4`` at position 3, predicts ``x_5`` from ``P_4``.

Targets and labels. The soft target is the verifier distribution restricted to the draft
vocabulary and renormalised: ``softmax(final_hidden @ lm_head[draft_ids].T)``. The label of a
position is the verifier's greedy token (argmax over its full vocabulary), which equals the data
token when the data was generated greedily by the verifier.

Out-of-draft-vocabulary policy. A position whose label is outside the draft vocabulary
(``t2d[label] == False``) can never be accepted. ``oov_policy="mask"`` (default, as the official
EAGLE-3 trainer) drops it from the loss; ``"keep"`` trains on it with the restricted soft
target. Either way it counts as a miss in the accuracy metrics, so ``τ̂`` is never flattered.

Loss. Per step, soft cross-entropy ``-Σ_j P_j log Q_j`` (= forward KL up to the target's
entropy) or hard cross-entropy on the label; masked sum over the loss positions divided by
``norm[k]`` (the number of loss positions of step k in the whole global batch, so padding and
the split across micro-batches and ranks do not change the value); steps weighted
``step_weight**k``.

Aligned columns (``align_topk = a > 0``; after the loss masking of GRIFFIN's token-alignable
training, arXiv 2502.11018, with a chain's top-1 as the natural choice). At inference, step k of
a column is only reached when steps ``0..k-1`` all drafted the verifier's token; elsewhere the
drafter's own state fed to step k describes a token that was rejected, a case decoding never
meets. With ``a``, step k's loss counts column ``t`` only while the label of every earlier step
``j < k`` at ``t`` was among that step's top-``a`` draft logits (``a = 1``: its argmax). Step 0
is always counted. The divisor stays ``norm[k]`` (all loss positions of step k), so a step's
loss is weighted by how often it is reached, as its acceptance is in ``τ``. speculators 0.9
masks its TTT loss the same way at top-1 (``prev_correct`` in its ``eagle3/core.py``).

A column out of the alignment at step k is out of every later step's loss too, and its step-k
state feeds only its own later steps (a later query sees the step-0 keys of its prefix and its
own column's keys of steps >= 1, :func:`specdraft.models.eagle3.ttt_mask`), so nothing it
computes from step k on reaches the loss or the gradient. On the live path
(``columns="live"``, the default) those steps are not computed: step 0 runs at its supervised
columns, step k at the columns still aligned and supervised, each set a subset of the one
before. The loss and the gradient are the masked unroll's up to float rounding, and so are the
``chain`` and ``reach`` counts (hence ``τ̂``); the skipped columns' hits are unknown and count
as misses, so the per-step ``acc`` (not ``cond_acc``) reads lower than the masked unroll's.
With the acceptance terms, whose chains read every supervised step, every live column is
computed and masked instead. On the quality rows (SmolLM2-135M, draft vocab 8,192, TTT 4,
the head frozen, CPU) a step of a drafter at 83 % step-0 training accuracy costs 0.83x, and
1,050 steps fit in the time 755 took without it (``benchmarks/bench_train_rows.py``;
docs/benchmarks.md, 2026-12-07).
Without ``align_topk`` the accuracy metrics count every supervised column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.artifacts.batches import TrainBatch
from specdraft.models.eagle3 import Eagle3DraftModel
from specdraft.train.fused_head import head_soft_ce


def shift(x: torch.Tensor, k: int, length: int, fill: float | int | bool = 0) -> torch.Tensor:
    """Columns ``t = 0..length-1`` of ``x[:, t+1+k]`` (``x`` [B, T, ...]), ``fill`` past the end."""
    out = x[:, 1 + k: 1 + k + length]
    missing = length - out.shape[1]
    if missing > 0:
        pad = torch.full((x.shape[0], missing, *x.shape[2:]), fill, dtype=x.dtype, device=x.device)
        out = torch.cat([out, pad], dim=1)
    return out


def _rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x[rows]`` for ascending unique ``rows`` [N]; a view when they are contiguous (a TTT
    step's supervised positions are all of them but the few with ``p < 1 + k``)."""
    if rows.numel() and int(rows[-1] - rows[0]) + 1 == rows.numel():
        return x[int(rows[0]): int(rows[-1]) + 1]
    return x[rows]


def chain_mask(valid: torch.Tensor) -> torch.Tensor:
    """valid [S, ...] bool -> [S, ...] bool: step ``k`` of a chain counts only while every step
    ``j <= k`` has a target (a chain ends at its first step without one: nothing after it can
    be accepted, or checked)."""
    return valid.long().cumprod(0).bool()


def expected_length_term(logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The expected-accepted-length term, summed over chains: ``sum_c sum_k M_k (1 - prod_{j<=k}
    p_j)`` (a scalar, float32), where ``p_j = exp(logp_j)`` is the drafter's probability of
    step ``j``'s target token and ``M`` = :func:`chain_mask`. ``sum_k M_k prod_{j<=k} p_j`` is
    the expected number of accepted drafts when step ``j`` is accepted with probability
    ``p_j`` given that steps ``< j`` were (greedy verification accepts step ``k`` only when steps
    ``1..k`` all match); the term is the expected number of the chain's targets *not* accepted,
    so it is >= 0, 0 at perfection, and its gradient is minus that of the expected length.

    After arXiv 2606.11552 ("Teaching Diffusion to Speculate Left-to-Right"), its chain term: a
    differentiable surrogate of the expected accepted length (the paper's exact equation was
    not available to us: this definition is ours, written from its abstract; docs/drafters.md).
    A chain is one EAGLE-3 column unrolled over its TTT steps or one DFlash block over its mask
    slots.

    logp [S, ...] float: ``log p`` of each step's target (any value where ``valid`` is False:
    replaced by 0 before use, so a ``-inf`` there gives no NaN); valid [S, ...] bool. The
    product is ``exp(cumsum(log p))`` in float32 (no clamp: ``log_softmax`` is finite, and a
    product that underflows to 0 has gradient 0). Gradients flow through every factor:
    ``d term / d log p_j = -sum_{k >= j} M_k prod_{i<=k} p_i`` (D-PACE's weight at alpha 0).
    """
    m = chain_mask(valid)
    cum = torch.where(m, logp.float(), torch.zeros((), device=logp.device)).cumsum(0)
    return (m.float() * (1 - cum.exp())).sum()


def first_error_focal_term(logp: torch.Tensor, hit: torch.Tensor, valid: torch.Tensor,
                           gamma: float) -> torch.Tensor:
    """The first-error focal term, summed over chains: at each chain's first wrong step ``f``
    (the first ``k`` with ``M_k`` whose greedy draft is not its target, every step before it
    right: the step that ends the accepted prefix), ``(1 - p_f)^gamma * (-log p_f)``; chains
    with no wrong step add 0. A scalar, float32.

    After arXiv 2606.11552's first-error focal loss (the focal form of Lin et al., arXiv
    1708.02002, at the position that breaks the accepted prefix; the paper's exact equation was
    not available to us: this definition is ours, docs/drafters.md).

    logp [S, ...] float (``log p`` of each step's target), hit [S, ...] bool (the drafter's
    argmax is the target: detached, it only chooses ``f``), valid [S, ...] bool. Gradients flow
    through both factors at ``f`` (``p_f`` is not detached, as in the focal loss), none
    elsewhere; ``gamma = 0`` is the plain cross-entropy of the first wrong step.
    """
    m = chain_mask(valid)
    right_before = torch.cat([torch.ones_like(hit[:1]), (hit | ~m)[:-1].long().cumprod(0).bool()])
    first = m & ~hit & right_before  # [S, ...]
    lp = torch.where(first, logp.float(), torch.zeros((), device=logp.device))
    return (first.float() * (1 - lp.exp()).clamp(min=0).pow(gamma) * -lp).sum()


def acceptance_terms(logp: torch.Tensor, hit: torch.Tensor, valid: torch.Tensor, *,
                     focal_weight: float, focal_gamma: float, length_weight: float
                     ) -> torch.Tensor:
    """``focal_weight * first_error_focal_term + length_weight * expected_length_term`` (a
    scalar; a weight of 0 skips its term). Shapes as :func:`expected_length_term`."""
    out = logp.new_zeros((), dtype=torch.float32)
    if focal_weight:
        out = out + focal_weight * first_error_focal_term(logp, hit, valid, focal_gamma)
    if length_weight:
        out = out + length_weight * expected_length_term(logp, valid)
    return out


@dataclass
class StepOutput:
    """What one TTT unroll returns (all detached except ``loss``).

    loss: scalar, weighted and normalised; loss_sum [S] float (unweighted masked sums per step);
    hits [S, B, L] bool; sup [S, B, L] bool (supervised, out-of-vocab included).
    """

    loss: torch.Tensor
    loss_sum: torch.Tensor
    hits: torch.Tensor
    sup: torch.Tensor


class TTTObjective(nn.Module):
    """Wraps the drafter so one ``forward`` runs the whole TTT unroll and its loss.

    Distributed wrappers (DDP, FSDP2) hook ``forward``, so the unroll must live in one; the
    drafter itself stays plain (parallelism is applied from outside, in
    :mod:`specdraft.train.distributed`).

    Acceptance terms (``focal_weight``, ``length_weight`` > 0): a column unrolled over its
    steps is a chain; :func:`acceptance_terms` of its steps' ``log p`` of the label (the
    verifier's greedy token, a draft id), divided by ``norm[0]`` (the chains that start in the
    global batch), are added to the loss. A step counts while its label is supervised and in
    the draft vocabulary (an out-of-vocabulary label ends the chain: it can never be drafted).
    """

    def __init__(self, drafter: Eagle3DraftModel, *, steps: int, step_weight: float = 0.8,
                 loss: str = "soft", oov_policy: str = "mask", align_topk: int = 0,
                 focal_weight: float = 0.0, focal_gamma: float = 2.0,
                 length_weight: float = 0.0, columns: str = "live", head: str = "fused"
                 ) -> None:
        super().__init__()
        if columns not in ("live", "all"):
            raise ValueError(f"columns {columns!r}: 'live' or 'all'")
        if head not in ("fused", "plain"):
            raise ValueError(f"head {head!r}: 'fused' or 'plain'")
        self.columns = columns
        self.head = head
        self.focal_weight, self.focal_gamma = focal_weight, focal_gamma
        self.length_weight = length_weight
        self.drafter = drafter
        self.steps = steps
        self.weights = [step_weight ** k for k in range(steps)]
        self.loss_kind = loss
        self.oov_policy = oov_policy
        self.align_topk = align_topk

    def step_loss(self, logits: torch.Tensor, probs: torch.Tensor, label: torch.Tensor
                  ) -> torch.Tensor:
        """Per-column loss ``[...]`` of one step; logits ``[..., K]``, probs ``[..., K]``,
        label ``[...]`` (any leading shape: ``[B, L]`` or the ``[N]`` supervised columns)."""
        logq = F.log_softmax(logits.float(), dim=-1)  # [..., K]
        if self.loss_kind == "hard":
            return -logq.gather(-1, label.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return -(probs * logq).sum(-1)

    def loss_mask(self, sup: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """Bool, ``sup``'s shape: the columns that enter the loss under the out-of-vocab policy."""
        return sup & (label >= 0) if self.oov_policy == "mask" else sup

    def forward(self, batch: TrainBatch, norm: torch.Tensor) -> StepOutput:
        """Unroll ``steps`` TTT steps over ``batch``; ``norm`` [S] float = loss positions of
        each step in the global batch (divided by the world size under DDP gradient averaging).

        The draft-vocab head (the largest matmul, ``[., H] x [H, K]``) and the loss run only on
        the supervised columns of each step, gathered: the other columns' logits are neither in
        the loss nor in the hit counts, and the next step is fed :meth:`feedback` of every
        column's prenorm state, not the logits. Equal to computing them everywhere and masking
        (the same per-column values; sums in another order, so equal up to float rounding).

        ``columns="live"`` (the default) runs the layer only at the columns some step
        supervises (:meth:`Eagle3DraftModel.ttt_step_live`; every column's step-0 key and
        value still); ``"all"`` runs it at every column (:meth:`Eagle3DraftModel.ttt_step`),
        the reference it equals up to float rounding.
        """
        m = self.drafter
        B, T = batch.input_ids.shape
        L = T - 1
        cols = torch.arange(L, device=batch.input_ids.device).expand(B, L)  # [B, L]
        packed = torch.full((B, T), -1, dtype=torch.long, device=cols.device)  # [B, T]
        packed[batch.sup] = torch.arange(batch.target_probs.shape[0], device=cols.device)
        hidden = m.fuse_aux(batch.aux_hidden[:, :L])  # [B, L, H]
        history: list[tuple[torch.Tensor, torch.Tensor]] = []
        aligned = torch.ones(B, L, dtype=torch.bool, device=cols.device)  # [B, L] (align_topk)
        loss = hidden.new_zeros((), dtype=torch.float32)
        loss_sum, hits, sups = [], [], []
        terms = self.focal_weight or self.length_weight
        fused = self.head == "fused" and self.loss_kind == "soft" and not terms \
            and self.align_topk <= 1
        # aligned columns only: with align_topk, a column's later steps are out of the loss
        # once it leaves the alignment, so they are not computed at all (the same loss and
        # gradient; the hits there are unknown and count as misses)
        skip = bool(self.align_topk) and self.columns == "live" and not terms
        chain: list[tuple[torch.Tensor, torch.Tensor]] = []  # (logp, valid) [B, L] per step
        step_sup = [shift(batch.sup, k, L, False) for k in range(self.steps)]  # S x [B, L]
        if self.columns == "live":
            need = step_sup[0] if skip else torch.stack(step_sup).any(0)  # [B, L]
            live = need.nonzero(as_tuple=True)  # [Nl] each
            slot = torch.full((B, L), -1, dtype=torch.long, device=cols.device)  # [B, L]
            slot[live] = torch.arange(live[0].numel(), device=cols.device)
        for k in range(self.steps):
            ids = shift(batch.input_ids, k, L)  # [B, L] token x_{t+1+k}
            sup = step_sup[k]  # [B, L]
            if skip and k:  # the columns still aligned: a subset of the last step's
                live = (aligned & sup).nonzero(as_tuple=True)  # [Nk] each
                hidden = hidden[slot[live]]  # [Nk, H]
                slot[live] = torch.arange(live[0].numel(), device=cols.device)
            # [N] the columns in the loss (supervised; aligned too with skip); p = t+1+k
            b, t = live if skip else sup.nonzero(as_tuple=True)
            if self.columns == "live":
                if k:
                    ids, at = ids[live], live[1] + k  # [Nl]
                else:
                    at = cols
                prenorm = m.ttt_step_live(ids, hidden, at, history, live, (B, L))  # [Nl, H]
                rows = prenorm if skip else prenorm[slot[b, t]]  # [N, H]
            else:
                prenorm = m.ttt_step(ids, hidden, cols + k, history)  # [B, L, H]
                rows = prenorm[b, t]
            hidden = m.feedback(prenorm)  # the next step's input (norm_output)
            label = batch.label[b, t + 1 + k]  # [N]
            mask = self.loss_mask(torch.ones_like(label, dtype=torch.bool), label)  # [N]
            if self.align_topk:
                mask = mask & aligned[b, t]
            probs = _rows(batch.target_probs, packed[b, t + 1 + k])  # [N, K]
            scale = self.weights[k] / norm[k] if norm[k] > 0 else 0.0  # no loss positions: 0
            hit = torch.zeros_like(sup)
            if fused:
                weighted, per_col, top = head_soft_ce(*m.head_parts(rows), probs,
                                                      mask.float() * scale)  # [], [N], [N]
            else:
                logits = m.logits(rows)  # [N, K]
                per_col = self.step_loss(logits, probs, label)  # [N]
                weighted = scale * (per_col * mask).sum()
                # max's indices: argmax's (the first on ties), 2-3x faster than argmax on CPU
                top = logits.detach().max(-1).indices
            loss = loss + weighted
            step_sum = (per_col * mask).sum()
            loss_sum.append(step_sum.detach())
            hit[b, t] = top == label
            hits.append(hit)
            if terms:
                chain.append(self.chain_step(logits, label, b, t, sup))
            if self.align_topk and k + 1 < self.steps:
                if not fused:  # fused: align_topk is 1, and top is the argmax already
                    top = logits.detach().topk(min(self.align_topk, logits.shape[-1]),
                                               dim=-1).indices
                top = top[:, None] if top.dim() == 1 else top  # [N, a]
                in_top = torch.zeros_like(sup)
                in_top[b, t] = (top == label.unsqueeze(-1)).any(-1)  # label -1: never in top
                aligned = aligned & in_top
            sups.append(sup)
        if terms:
            logp, valid = (torch.stack(x) for x in zip(*chain))  # [S, B, L]
            extra = acceptance_terms(logp, torch.stack(hits), valid,
                                     focal_weight=self.focal_weight,
                                     focal_gamma=self.focal_gamma,
                                     length_weight=self.length_weight)
            loss = loss + (extra / norm[0] if norm[0] > 0 else 0.0 * extra)
        return StepOutput(loss, torch.stack(loss_sum), torch.stack(hits), torch.stack(sups))

    def chain_step(self, logits: torch.Tensor, label: torch.Tensor, b: torch.Tensor,
                   t: torch.Tensor, sup: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp, valid) [B, L] of one step for the acceptance terms: ``log p`` of the label at
        the supervised columns ``(b, t)`` (logits [N, K], label [N], -1 outside the draft
        vocabulary), 0 elsewhere; valid where the label is supervised and in the vocabulary."""
        inside = label >= 0
        lp = F.log_softmax(logits.float(), -1).gather(-1, label.clamp(min=0)[:, None])[:, 0]
        dense = torch.zeros(sup.shape, device=lp.device).index_put((b, t), lp * inside)
        valid = torch.zeros_like(sup)
        valid[b, t] = inside
        return dense, valid

    def loss_counts(self, batch: TrainBatch) -> torch.Tensor:
        """[S] float: loss positions per step in ``batch`` (known before the forward)."""
        L = batch.input_ids.shape[1] - 1
        return torch.stack([self.loss_mask(shift(batch.sup, k, L, False),
                                           shift(batch.label, k, L, -1)).sum()
                            for k in range(self.steps)]).float()


def ttt_objective(drafter: Eagle3DraftModel, cfg: Any) -> TTTObjective:
    """The EAGLE-3 kind's objective (:mod:`specdraft.kinds`) from the train config's options:
    ``ttt_steps``, ``step_weight``, ``loss``, ``oov_policy``, ``align_topk`` and the shared
    acceptance terms (``loss_focal_weight``, ``loss_focal_gamma``,
    ``loss_expected_length_weight``)."""
    return TTTObjective(drafter, steps=cfg.ttt_steps, step_weight=cfg.step_weight,
                        loss=cfg.loss, oov_policy=cfg.oov_policy, align_topk=cfg.align_topk,
                        focal_weight=cfg.loss_focal_weight, focal_gamma=cfg.loss_focal_gamma,
                        length_weight=cfg.loss_expected_length_weight)
