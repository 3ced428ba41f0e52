"""The DFlash training objective: random anchors per row, one block per anchor, the block mask of
:func:`specdraft.models.dflash.block_mask`, and a cross-entropy weighted by an exponential decay
over block positions (the DFlash recipe: an early slot's error ends the accepted prefix, so early
slots weigh more).

A row is ``ids`` [T] with ``loss_mask`` [T] and the verifier's states of the drafter's target
layers ``hidden`` [T, n*Ht] (HF ``hidden_states[id + 1]``, :meth:`DFlashConfig.hf_hidden_ids`).
An anchor ``a`` is a position whose next token is supervised (``loss_mask[a + 1] == 1``, the
convention of :func:`specdraft.core.conventions.supervised_mask`); its block is ``[ids[a], mask,
..., mask]`` at positions ``a .. a+K``, it sees the states of positions ``< a`` (as in serving:
:mod:`specdraft.eval.dflash`), and slot ``j`` is trained on ``ids[a + j]`` where that token is
supervised. The forward is the one offline eval and vLLM run (:meth:`DFlashDraftModel.forward`).

Settings of the recipe (docs/drafters.md "DFlash recipe settings"; defaults = the above): the
anchor draw (:func:`vllm_anchorable`, :func:`draw_distinct`), D-PACE slot weights
(:func:`dpace_weights`), the verifier's argmax or distribution as labels
(:meth:`DFlashObjective.hard_targets`, :meth:`DFlashObjective.teacher_probs`) and the
acceptance terms shared with EAGLE-3 (:func:`specdraft.train.objective.acceptance_terms`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.artifacts.batches import TrainBatch
from specdraft.core.conventions import IGNORE_INDEX as IGNORE, supervised_mask
from specdraft.models.dflash import DFlashDraftModel
from specdraft.train.objective import StepOutput, acceptance_terms


def draw_anchors(anchorable: torch.Tensor, n_blocks: int,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """anchorable [B, T] bool -> anchors [B, n_blocks] int64 (on ``anchorable``'s device), drawn
    uniformly with replacement among each row's True positions, with ``generator`` (None: torch's
    global CPU generator, which training checkpoints save). Raises ValueError naming the row
    when it has none."""
    B, T = anchorable.shape
    out = torch.empty(B, n_blocks, dtype=torch.long)
    anchorable = anchorable.cpu()
    for b in range(B):
        cand = torch.nonzero(anchorable[b]).flatten()
        if len(cand) == 0:
            raise ValueError(f"row {b}: no supervised token, no anchor to draw")
        out[b] = cand[torch.randint(len(cand), (n_blocks,), generator=generator)]
    return out


def vllm_anchorable(loss_mask: torch.Tensor) -> torch.Tensor:
    """loss_mask [..., T] (0/1) -> bool [..., T]: the positions ``a`` vLLM anchors a block at
    and that train something: ``x_a`` is a generated token (``loss_mask[a] == 1``: vLLM's
    block starts at the token the verifier just sampled, ``v1/spec_decode/dflash.py``
    ``set_inputs_first_pass``: the query is ``next_token_ids`` then the mask tokens, never a
    prompt token) and its next token is supervised (``loss_mask[a + 1] == 1``, so slot 1 has a
    target). The last prompt token (``loss_mask[a] == 0``, ``loss_mask[a + 1] == 1``), which
    :func:`sample_anchors` may draw, is never an anchor in serving."""
    return (loss_mask == 1) & supervised_mask(loss_mask)


def draw_distinct(anchorable: torch.Tensor, n_blocks: int, generator: torch.Generator
                  ) -> torch.Tensor:
    """anchorable [T] bool -> [min(n_blocks, #True)] int64, ascending: distinct positions drawn
    uniformly without replacement among the True ones (a random permutation's first
    ``n_blocks``), with ``generator``. Empty when the row has none."""
    cand = torch.nonzero(anchorable.cpu()).flatten()
    pick = torch.randperm(len(cand), generator=generator)[:n_blocks]
    return cand[pick].sort().values


def sample_anchors(loss_mask: torch.Tensor, n_blocks: int, generator: torch.Generator
                   ) -> torch.Tensor:
    """loss_mask [B, T] (0/1) -> anchors [B, n_blocks] int64, drawn uniformly (with replacement)
    among each row's positions ``a`` with ``loss_mask[a + 1] == 1``
    (:func:`specdraft.core.conventions.supervised_mask`). Raises ValueError naming the row when
    it has none."""
    return draw_anchors(supervised_mask(loss_mask), n_blocks, generator)


def block_batch(ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, *,
                block_size: int, mask_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids, loss_mask [B, T]; anchors [B, nb] -> (block_ids [B, nb, Q], targets [B, nb, Q-1])
    with Q = block_size: block ``[ids[a], mask × (Q-1)]``, slot ``j`` (1..Q-1) targeting
    ``ids[a + j]`` when ``a + j < T`` and ``loss_mask[a + j] == 1``, else :data:`IGNORE`."""
    B, T = ids.shape
    j = torch.arange(1, block_size)
    pos = anchors[:, :, None] + j  # [B, nb, Q-1]
    inside = pos < T
    safe = pos.clamp(max=T - 1)
    rows = torch.arange(B)[:, None, None]
    targets = torch.where(inside & (loss_mask[rows, safe] == 1), ids[rows, safe],
                          torch.full_like(safe, IGNORE))
    first = ids[torch.arange(B)[:, None], anchors]  # [B, nb]
    masks = torch.full((*anchors.shape, block_size - 1), mask_token_id, dtype=ids.dtype)
    return torch.cat([first[:, :, None], masks], dim=-1), targets


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[Q-1] float: ``exp(-(j - 1) / gamma)`` for slots j = 1..Q-1 (slot 1 weighs 1)."""
    return torch.exp(-torch.arange(block_size - 1, dtype=torch.float32) / gamma)


def dpace_weights(p: torch.Tensor, valid: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE slot weights (arXiv 2605.18810, "Dynamic Position-Aware Cross-Entropy";
    Lucas-TY/D-PACE ``specforge/core/dflash.py`` and speculators 0.9 ``losses/utils.py``
    ``dpace_loss_decay``, read for the formula):

        s_j = (1 - alpha) p_j + alpha   (1 where slot j has no target)
        P_k = prod_{j<=k} s_j,   w_k = valid_k * sum_{i>=k} valid_i P_i

    p [..., S] float: the drafter's probability of each slot's target, detached (the weights
    are constants of the step: gradients flow only through the cross-entropy they multiply);
    valid [..., S] bool. ``w_k`` is ``d/d log p_k`` of the smoothed expected accepted length
    ``sum_i valid_i P_i``: a slot weighs what the accepted length would gain from it, so the
    weight moves to the slots that limit acceptance as training goes. Returns [..., S] float32
    (alpha 1: ``w_k`` = the number of supervised slots from ``k`` on)."""
    p = p.detach().float()
    s = torch.where(valid, (1 - alpha) * p + alpha, torch.ones_like(p))
    prefix = s.cumprod(-1) * valid
    return prefix.flip(-1).cumsum(-1).flip(-1) * valid


def block_loss(model: DFlashDraftModel, hidden: torch.Tensor, ids: torch.Tensor,
               loss_mask: torch.Tensor, anchors: torch.Tensor, *, gamma: float
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """The position-weighted cross-entropy of ``model``'s blocks at ``anchors``.

    hidden [B, T, n*Ht] float, ids / loss_mask [B, T], anchors [B, nb]. Returns (loss [] =
    sum_j w_j CE_j / sum_j w_j over the supervised slots, {"loss", "acc_1", ..., "acc_{Q-1}"}:
    per-slot argmax accuracy over the supervised slots).
    """
    c = model.config
    block_ids, targets = block_batch(ids, loss_mask, anchors, block_size=c.block_size,
                                     mask_token_id=c.mask_token_id)
    out = model(hidden, block_ids.to(hidden.device), anchors.to(hidden.device))  # [B,nb,Q,H]
    logits = model.lm_head(out[:, :, 1:]).float()  # [B, nb, Q-1, V]
    targets = targets.to(hidden.device)
    ce = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), ignore_index=IGNORE,
                         reduction="none").view(targets.shape)
    valid = (targets != IGNORE).float()
    w = position_weights(c.block_size, gamma).to(hidden.device) * valid  # [B, nb, Q-1]
    loss = (w * ce).sum() / w.sum().clamp_min(1e-9)
    hits = (logits.argmax(-1) == targets).float() * valid
    acc = (hits.sum((0, 1)) / valid.sum((0, 1)).clamp_min(1)).tolist()
    stats = {"loss": float(loss.detach()), **{f"acc_{j + 1}": a for j, a in enumerate(acc)}}
    return loss, stats


class DFlashObjective(nn.Module):
    """The DFlash objective behind the trainer's interface (:class:`~specdraft.train.loop.Trainer`
    runs it as it runs :class:`~specdraft.train.objective.TTTObjective`): the block's mask slots
    are the "steps", ``steps = block_size - 1``; slot ``j`` (1-based) is step ``j - 1``, with
    weight ``exp(-(j - 1) / gamma)`` (:func:`position_weights`) or, with ``weights="dpace"``,
    a weight per block and slot (:func:`dpace_weights`).

    A batch is the EAGLE-3 batch (:class:`~specdraft.artifacts.batches.TrainBatch`): the drafter
    reads ``aux_hidden`` as its target states (the run's aux ids are its ``target_layer_ids + 1``)
    and ``sup`` is the supervised set (``loss_mask[a + 1] == 1``; ``loss_mask[p] = sup[p - 1]``).

    Labels (``labels``): ``row`` (default) the row's own tokens at supervised positions;
    ``verifier`` the verifier's argmax at the previous position (slot ``j`` of anchor ``a``:
    the verifier's prediction at ``a + j - 1``, ``batch.verifier_token``; equal to ``row`` on
    rows the verifier answered greedily); ``soft`` the verifier's full-vocabulary distribution
    there, ``softmax(final_hidden @ lm_head.T)`` in float32 (the drafter's ``lm_head`` is the
    verifier's), with the soft cross-entropy ``-sum_v P_v log Q_v`` (forward KL up to the
    teacher's entropy; needs ``batch.final_hidden``, :attr:`needs_final_hidden`). Hits, D-PACE
    and the acceptance terms use the hard target (the verifier's argmax under ``soft``).

    Anchors (``anchor_draw``): ``replacement`` (this class's default; the train config's is
    ``distinct`` with 512) ``anchors`` per row drawn with
    replacement among the supervised positions; ``distinct`` up to ``anchors`` distinct
    positions per row among those vLLM anchors at (:func:`vllm_anchorable`), fewer when the
    row has fewer (its blocks padded to the micro-batch's widest row, the padding blocks
    without targets). Either way from a generator of the row alone: seeded by ``seed``, the
    optimizer step (:attr:`step`, set by the trainer; a fixed value in eval mode, so validation
    reads the same blocks every time) and the row's supervised tokens. So a row gets the same
    blocks at a given step whichever micro-batch or rank it lands in, and after a resume (DDP
    and gradient accumulation split the global batch without changing it, as for EAGLE-3).
    They are drawn once per batch, by :meth:`loss_counts` (which the trainer calls before the
    forward: the loss is normalised by the global count of supervised slots) and kept on the
    batch.

    Loss: ``sum_k sum_blocks w_{b,k} * CE_{b,k} / norm_k``, ``CE`` the cross-entropy of slot
    ``k + 1`` and ``norm_k`` the count of its supervised targets in the global batch (so
    micro-batches and ranks do not change it), the same reduction as the EAGLE-3 objective's
    steps; plus the acceptance terms (:func:`~specdraft.train.objective.acceptance_terms`, a
    block is one chain) divided by ``norm_0``. Training counts how often the verifier's argmax
    differs from the row's next token at the supervised positions (:meth:`run_report`).
    """

    def __init__(self, drafter: DFlashDraftModel, *, anchors: int, gamma: float,
                 seed: int = 0, anchor_draw: str = "replacement", weights: str = "exp",
                 dpace_alpha: float = 0.5, labels: str = "row", focal_weight: float = 0.0,
                 focal_gamma: float = 2.0, length_weight: float = 0.0) -> None:
        super().__init__()
        self.drafter = drafter
        self.steps = drafter.config.block_size - 1
        self.weight_kind, self.dpace_alpha = weights, dpace_alpha
        self.weights = position_weights(drafter.config.block_size, gamma).tolist() \
            if weights == "exp" else [1.0] * self.steps  # dpace: the log's loss = sum of CEs
        self.n_anchors = anchors
        self.anchor_draw = anchor_draw
        self.labels = labels
        self.focal_weight, self.focal_gamma = focal_weight, focal_gamma
        self.length_weight = length_weight
        self.seed = seed
        self.step = 0  # the optimizer step being taken (Trainer.train_step sets it)
        self.needs_final_hidden = labels == "soft"
        self.needs_target_probs = False  # the draft-vocab teacher of EAGLE-3: never read here
        self.label_counts = torch.zeros(2, dtype=torch.float64)  # [differ, supervised]

    def row_generator(self, ids: torch.Tensor, sup: torch.Tensor) -> torch.Generator:
        """The anchors' generator of one row (ids, sup [T]): seeded by ``seed``, the step (-1 in
        eval mode) and the row's supervised tokens (padding-free: the same row in any batch).
        Python's hash of a tuple of ints is deterministic across processes."""
        step = self.step if self.training else -1
        key = hash((self.seed, step, tuple(ids[sup].tolist())))
        return torch.Generator().manual_seed(key % (2 ** 63))

    def row_anchors(self, ids: torch.Tensor, sup: torch.Tensor) -> torch.Tensor:
        """[n] int64 anchors of one row (ids, sup [T] on the CPU) under :attr:`anchor_draw`."""
        g = self.row_generator(ids, sup)
        if self.anchor_draw == "replacement":
            return draw_anchors(sup[None], self.n_anchors, g)[0]
        mask = torch.zeros_like(sup, dtype=torch.long)  # loss_mask[p] = sup[p - 1]
        mask[1:] = sup[:-1].long()
        return draw_distinct(vllm_anchorable(mask), self.n_anchors, g)

    def blocks(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(anchors [B, nb], block_ids [B, nb, Q], targets [B, nb, Q-1]) of ``batch``, drawn on
        the first call and kept on the batch (``batch.dflash_blocks``); ``nb`` is the widest
        row's count (at least 1), a shorter row's extra blocks anchored at 0 without targets."""
        cached = getattr(batch, "dflash_blocks", None)
        if cached is not None:
            return cached
        ids_cpu, sup_cpu = batch.input_ids.cpu(), batch.sup.cpu()
        rows = [self.row_anchors(ids_cpu[b], sup_cpu[b]) for b in range(len(sup_cpu))]
        nb = max([1] + [len(r) for r in rows])
        anchors = torch.zeros(len(rows), nb, dtype=torch.long)
        real = torch.zeros(len(rows), nb, dtype=torch.bool)
        for b, r in enumerate(rows):
            anchors[b, :len(r)], real[b, :len(r)] = r, True
        mask = torch.zeros_like(sup_cpu, dtype=torch.long)  # loss_mask[p] = sup[p - 1]
        mask[:, 1:] = sup_cpu[:, :-1].long()
        c = self.drafter.config
        block_ids, targets = block_batch(ids_cpu, mask, anchors, block_size=c.block_size,
                                         mask_token_id=c.mask_token_id)
        targets[~real] = IGNORE
        if self.training:
            self.count_labels(batch)
        dev = batch.input_ids.device
        batch.dflash_blocks = (anchors.to(dev), block_ids.to(dev), targets.to(dev))
        return batch.dflash_blocks

    def count_labels(self, batch: TrainBatch) -> None:
        """Add ``batch``'s supervised positions, and those where the verifier's argmax
        (``verifier_token``) is not the row's next token, to :attr:`label_counts`."""
        if batch.verifier_token is None:
            return
        sup = batch.sup[:, :-1]
        differ = (batch.verifier_token[:, :-1] != batch.input_ids[:, 1:]) & sup
        self.label_counts += torch.tensor([float(differ.sum()), float(sup.sum())],
                                          dtype=torch.float64)

    def loss_counts(self, batch: TrainBatch) -> torch.Tensor:
        """[S] float: supervised targets of each slot in ``batch`` (draws its blocks)."""
        targets = self.blocks(batch)[2]
        return (targets != IGNORE).sum((0, 1)).float()

    def hard_targets(self, batch: TrainBatch, anchors: torch.Tensor, targets: torch.Tensor
                     ) -> torch.Tensor:
        """[B, nb, S] int64: each slot's hard target, :data:`IGNORE` where it has none: the
        row's tokens (``labels="row"``) or the verifier's argmax at the slot's previous
        position ``a + j - 1`` (``verifier``, ``soft``)."""
        if self.labels == "row":
            return targets
        if batch.verifier_token is None:
            raise ValueError(f"--dflash-labels {self.labels}: the batch carries no verifier "
                             f"argmax (artifacts.batches.Collator computes it)")
        prev = anchors[:, :, None] + torch.arange(self.steps, device=anchors.device)  # a+j-1
        rows = torch.arange(len(anchors), device=anchors.device)[:, None, None]
        teacher = batch.verifier_token[rows, prev.clamp(max=batch.sup.shape[1] - 1)]
        return torch.where(targets != IGNORE, teacher, targets)

    def teacher_probs(self, batch: TrainBatch, b: torch.Tensor, n: torch.Tensor,
                      j: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """[N, V] float32: the verifier's full-vocabulary distribution at position ``a + j``
        (0-based slot ``j``: the position that predicts the slot's token) of each supervised
        slot ``(b, n, j)``, from the stored final states and the verifier's head, in float32
        outside autocast."""
        if batch.final_hidden is None:
            raise ValueError("--dflash-labels soft: the batch carries no final states (the "
                             "collator keeps them with keep_final_hidden)")
        packed = torch.full(batch.sup.shape, -1, dtype=torch.long, device=batch.sup.device)
        packed[batch.sup] = torch.arange(int(batch.sup.sum()), device=packed.device)
        idx = packed[b, anchors[b, n] + j]  # [N] >= 0: a supervised slot's position is in sup
        with torch.autocast(batch.sup.device.type, enabled=False):
            logits = batch.final_hidden[idx].float() @ self.drafter.lm_head.weight.float().T
        return torch.softmax(logits, -1)

    def forward(self, batch: TrainBatch, norm: torch.Tensor) -> StepOutput:
        """The blocks' position-weighted loss; ``norm`` [S] = supervised targets per slot in the
        global batch (divided by the world size under DDP averaging). Returns
        :class:`~specdraft.train.objective.StepOutput` with ``hits`` / ``sup`` [S, B, nb]: a
        block is one column, so the chain counts of :mod:`specdraft.train.metrics` are its
        greedy acceptance."""
        anchors, block_ids, targets = self.blocks(batch)
        out = self.drafter(batch.aux_hidden, block_ids, anchors)  # [B, nb, Q, H]
        hard = self.hard_targets(batch, anchors, targets)  # [B, nb, S]
        valid = hard != IGNORE  # [B, nb, S]
        b, n, j = valid.nonzero(as_tuple=True)  # [N] the supervised slots only
        logits = self.drafter.lm_head(out[b, n, j + 1]).float()  # [N, V]
        label = hard[b, n, j]
        logp = -F.cross_entropy(logits, label, reduction="none")  # [N] log p of the target
        if self.labels == "soft":
            logq = F.log_softmax(logits, -1)  # [N, V]
            ce = -(self.teacher_probs(batch, b, n, j, anchors) * logq).sum(-1)  # [N]
        else:
            ce = -logp
        hits = torch.zeros_like(valid)
        hits[b, n, j] = logits.detach().max(-1).indices == label  # = argmax, faster on CPU
        loss = self.slot_loss(ce, logp, valid, (b, n, j), norm)
        if self.focal_weight or self.length_weight:
            dense = torch.zeros(valid.shape, device=logp.device).index_put((b, n, j), logp)
            extra = acceptance_terms(dense.permute(2, 0, 1), hits.permute(2, 0, 1),
                                     valid.permute(2, 0, 1), focal_weight=self.focal_weight,
                                     focal_gamma=self.focal_gamma,
                                     length_weight=self.length_weight)
            loss = loss + (extra / norm[0] if norm[0] > 0 else 0.0 * extra)
        loss_sum = ce.new_zeros(self.steps).index_add(0, j, ce.detach())  # [S]
        return StepOutput(loss, loss_sum, hits.permute(2, 0, 1), valid.permute(2, 0, 1))

    def slot_loss(self, ce: torch.Tensor, logp: torch.Tensor, valid: torch.Tensor,
                  where: tuple[torch.Tensor, ...], norm: torch.Tensor) -> torch.Tensor:
        """``sum_k sum_{slots of k} w * CE / norm_k``: ce, logp [N] at the supervised slots
        ``where`` = (b, n, j) of valid [B, nb, S]; ``w`` the slot's fixed weight (``exp``) or
        its D-PACE weight from the detached ``p = exp(logp)`` of its block."""
        b, n, j = where
        if self.weight_kind == "dpace":
            p = torch.zeros(valid.shape, device=logp.device)
            p[b, n, j] = logp.detach().exp()
            w = dpace_weights(p, valid, self.dpace_alpha)[b, n, j]  # [N]
            per_slot = ce.new_zeros(self.steps).index_add(0, j, w * ce)  # [S]
        else:  # the fixed weight of each slot, applied to its sum
            per_slot = ce.new_zeros(self.steps).index_add(0, j, ce)  # [S]
            per_slot = torch.tensor(self.weights, device=ce.device) * per_slot
        return (per_slot / norm.clamp(min=1e-9) * (norm > 0)).sum()

    def run_report(self, env: Any) -> dict[str, Any]:
        """The label counter over the run's training batches (all ranks; collective): prints
        one line on rank 0 and returns ``{"verifier_argmax_differs": {"positions", "differ",
        "fraction"}}`` for the train manifest."""
        from specdraft.train.distributed import all_reduce_sum

        counts = all_reduce_sum(self.label_counts.clone().to(env.device), env).cpu()
        differ, total = int(counts[0]), int(counts[1])
        frac = differ / total if total else 0.0
        if env.is_main:
            print(f"train: the verifier's argmax differs from the row's token at {differ} of "
                  f"{total} supervised training positions ({100 * frac:.2f} %)", flush=True)
        return {"verifier_argmax_differs": {"positions": total, "differ": differ,
                                            "fraction": frac}}


def overfit(model: DFlashDraftModel, hidden: torch.Tensor, ids: torch.Tensor,
            loss_mask: torch.Tensor, *, steps: int, lr: float = 3e-3, n_blocks: int = 8,
            gamma: float = 7.0, seed: int = 0) -> list[dict[str, float]]:
    """Train ``model``'s own weights (not the verifier's tables) with AdamW on one fixed batch,
    fresh random anchors every step; returns the per-step stats of :func:`block_loss`. The
    minimal loop the engine test needs (``specdraft train`` has no DFlash option yet)."""
    g = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    log = []
    model.train()
    for step in range(steps):
        anchors = sample_anchors(loss_mask, n_blocks, g)
        loss, stats = block_loss(model, hidden, ids, loss_mask, anchors, gamma=gamma)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        log.append(stats)
    model.eval()
    assert math.isfinite(log[-1]["loss"]), log[-1]
    return log


def dflash_objective(drafter: DFlashDraftModel, cfg: Any) -> DFlashObjective:
    """The DFlash kind's objective (:mod:`specdraft.kinds`) from the train config's options:
    ``dflash_anchors``, ``dflash_anchor_draw``, the slot weights (``dflash_weights``, the
    decay ``cfg.gamma()``, ``dflash_dpace_alpha``), ``dflash_labels``, the shared acceptance
    terms (``loss_focal_weight``, ``loss_focal_gamma``, ``loss_expected_length_weight``) and
    ``seed``."""
    return DFlashObjective(drafter, anchors=cfg.dflash_anchors, gamma=cfg.gamma(),
                           seed=cfg.seed, anchor_draw=cfg.dflash_anchor_draw,
                           weights=cfg.dflash_weights, dpace_alpha=cfg.dflash_dpace_alpha,
                           labels=cfg.dflash_labels, focal_weight=cfg.loss_focal_weight,
                           focal_gamma=cfg.loss_focal_gamma,
                           length_weight=cfg.loss_expected_length_weight)
