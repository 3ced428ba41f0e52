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
from specdraft.train.objective import StepOutput


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
    weight ``exp(-(j - 1) / gamma)`` (:func:`position_weights`).

    A batch is the EAGLE-3 batch (:class:`~specdraft.artifacts.batches.TrainBatch`): the drafter
    reads ``aux_hidden`` as its target states (the run's aux ids are its ``target_layer_ids + 1``)
    and ``sup`` is the anchorable set (``loss_mask[a + 1] == 1``). Targets are the row's own
    tokens at supervised positions (the verifier's answers, regenerated), over the verifier's
    full vocabulary (a DFlash drafter reads out with the verifier's head); the soft teacher
    of EAGLE-3 is not used.

    Anchors: ``anchors`` per row, drawn with replacement among the anchorable positions, from a
    generator of the row alone: seeded by ``seed``, the optimizer step (:attr:`step`, set by the
    trainer; a fixed value in eval mode, so validation reads the same blocks every time) and the
    row's supervised tokens. So a row gets the same blocks at a given step whichever micro-batch
    or rank it lands in, and after a resume (DDP and gradient accumulation split the global batch
    without changing it, as for EAGLE-3). They are drawn once per batch, by :meth:`loss_counts`
    (which the trainer calls before the forward: the loss is normalised by the global count of
    supervised slots) and kept on the batch.

    Loss: ``sum_k w_k * CE_k / norm_k``, ``CE_k`` the summed cross-entropy of slot ``k + 1`` over
    its supervised targets and ``norm_k`` their count in the global batch (so micro-batches and
    ranks do not change it), the same reduction as the EAGLE-3 objective's steps.
    """

    def __init__(self, drafter: DFlashDraftModel, *, anchors: int, gamma: float,
                 seed: int = 0) -> None:
        super().__init__()
        self.drafter = drafter
        self.steps = drafter.config.block_size - 1
        self.weights = position_weights(drafter.config.block_size, gamma).tolist()
        self.n_anchors = anchors
        self.seed = seed
        self.step = 0  # the optimizer step being taken (Trainer.train_step sets it)

    def row_generator(self, ids: torch.Tensor, sup: torch.Tensor) -> torch.Generator:
        """The anchors' generator of one row (ids, sup [T]): seeded by ``seed``, the step (-1 in
        eval mode) and the row's supervised tokens (padding-free: the same row in any batch).
        Python's hash of a tuple of ints is deterministic across processes."""
        step = self.step if self.training else -1
        key = hash((self.seed, step, tuple(ids[sup].tolist())))
        return torch.Generator().manual_seed(key % (2 ** 63))

    def blocks(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(anchors [B, nb], block_ids [B, nb, Q], targets [B, nb, Q-1]) of ``batch``, drawn on
        the first call and kept on the batch (``batch.dflash_blocks``)."""
        cached = getattr(batch, "dflash_blocks", None)
        if cached is not None:
            return cached
        ids_cpu, sup_cpu = batch.input_ids.cpu(), batch.sup.cpu()
        anchors = torch.cat([draw_anchors(sup_cpu[b:b + 1], self.n_anchors,
                                          self.row_generator(ids_cpu[b], sup_cpu[b]))
                             for b in range(len(sup_cpu))])  # [B, nb]
        mask = torch.zeros_like(batch.sup, dtype=torch.long)  # loss_mask[p] = sup[p - 1]
        mask[:, 1:] = batch.sup[:, :-1].long()
        c = self.drafter.config
        block_ids, targets = block_batch(batch.input_ids.cpu(), mask.cpu(), anchors,
                                         block_size=c.block_size,
                                         mask_token_id=c.mask_token_id)
        dev = batch.input_ids.device
        batch.dflash_blocks = (anchors.to(dev), block_ids.to(dev), targets.to(dev))
        return batch.dflash_blocks

    def loss_counts(self, batch: TrainBatch) -> torch.Tensor:
        """[S] float: supervised targets of each slot in ``batch`` (draws its blocks)."""
        targets = self.blocks(batch)[2]
        return (targets != IGNORE).sum((0, 1)).float()

    def forward(self, batch: TrainBatch, norm: torch.Tensor) -> StepOutput:
        """The blocks' position-weighted loss; ``norm`` [S] = supervised targets per slot in the
        global batch (divided by the world size under DDP averaging). Returns
        :class:`~specdraft.train.objective.StepOutput` with ``hits`` / ``sup`` [S, B, nb]: a
        block is one column, so the chain counts of :mod:`specdraft.train.metrics` are its
        greedy acceptance."""
        anchors, block_ids, targets = self.blocks(batch)
        out = self.drafter(batch.aux_hidden, block_ids, anchors)  # [B, nb, Q, H]
        valid = targets != IGNORE  # [B, nb, S]
        b, n, j = valid.nonzero(as_tuple=True)  # [N] the supervised slots only
        logits = self.drafter.lm_head(out[b, n, j + 1]).float()  # [N, V]
        label = targets[b, n, j]
        ce = F.cross_entropy(logits, label, reduction="none")  # [N]
        loss_sum = ce.new_zeros(self.steps).index_add(0, j, ce)  # [S]
        w = torch.tensor(self.weights, device=ce.device)
        loss = (w * loss_sum / norm.clamp(min=1e-9) * (norm > 0)).sum()
        hits = torch.zeros_like(valid)
        hits[b, n, j] = logits.detach().argmax(-1) == label
        return StepOutput(loss, loss_sum.detach(), hits.permute(2, 0, 1),
                          valid.permute(2, 0, 1))


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
    ``dflash_anchors``, the slot decay (``cfg.gamma()``) and ``seed``."""
    return DFlashObjective(drafter, anchors=cfg.dflash_anchors, gamma=cfg.gamma(), seed=cfg.seed)
