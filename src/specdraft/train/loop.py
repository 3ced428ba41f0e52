"""The training loop: AdamW + warmup/cosine, gradient accumulation, validation by ``τ̂``,
checkpoints every N steps and exact resume.

Exactness. Every quantity the next step depends on is in the checkpoint (weights, AdamW
moments, scheduler, RNG, data position); the data plan is recomputed from the seed; the loss of
a step is normalised by the global count of loss positions, computed before the forward, so the
gradient is the same whether the global batch is split over micro-batches or ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdraft.core.atomic import atomic_open
from specdraft.core.errors import StageDirError
from specdraft.core.jsonl import JsonlWriter, iter_jsonl
from specdraft.core.resume import check_resume_settings
from specdraft.core.verifier import resolve_train_dtype
from specdraft.core.manifest import write_provenance
from specdraft.core.progress import StageProgress
from specdraft.kinds import Objective
from specdraft.models.io import Drafter, save_drafter
from specdraft.train import checkpoint as ckpt
from specdraft.train.augment import noised_aux_hidden
from specdraft.train.config import TrainConfig
from specdraft.artifacts.batches import Collator
from specdraft.train.data import MicroBatch, plan_epoch, plan_eval, rank_micro_batches
from specdraft.core.context import StageContext
from specdraft.train.distributed import (all_reduce_sum, barrier, full_states, is_fsdp,
                                         load_full_states)
from specdraft.train.metrics import hit_counts, summarize


def warmup_steps(cfg: Any, total: int) -> int:
    """The warmup's optimizer steps for a run of ``total`` steps: ``ceil(warmup_ratio * total)``
    when ``cfg.warmup_ratio`` is set (transformers' ``TrainingArguments.get_warmup_steps``
    rounding), else ``cfg.warmup_steps``; at most ``total // 2`` either way, so a short run
    still decays."""
    want = math.ceil(cfg.warmup_ratio * total) if cfg.warmup_ratio is not None \
        else cfg.warmup_steps
    return min(want, total // 2)


def lr_factor(step: int, *, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr after ``step`` optimizer steps: linear warmup over ``warmup``
    steps, then cosine decay to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(module: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW (β = beta1/beta2, default 0.9/0.95) over the trainable parameters."""
    params = [p for p in module.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             weight_decay=cfg.weight_decay)


def autocast_context(dtype: str, device: torch.device):
    """The compute precision ``dtype`` (``float32`` or ``bfloat16``, after
    :func:`specdraft.core.verifier.resolve_train_dtype`) on ``device``: ``float32`` runs as is,
    ``bfloat16`` under ``torch.autocast``. Autocast only: parameters, gradients and AdamW moments
    stay fp32 (the master weights); matmuls and attention run in bf16, norms, softmax and the loss
    in fp32 (RMSNorm and the loss upcast explicitly). Raises ValueError for an unresolved
    ``auto``."""
    if dtype == "auto":
        raise ValueError("autocast_context needs a resolved dtype: resolve_train_dtype first")
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, dtype))


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated on ``device``, or the peak RSS of this process (MiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Window:
    """Training figures accumulated between two log lines (local to the rank)."""

    steps: int
    counts: torch.Tensor = None
    loss_sum: torch.Tensor = None
    loss_count: torch.Tensor = None
    tokens: int = 0
    t0: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.counts = torch.zeros(4, self.steps, dtype=torch.float64)
        self.loss_sum = torch.zeros(self.steps, dtype=torch.float64)
        self.loss_count = torch.zeros(self.steps, dtype=torch.float64)


@dataclass
class Data:
    """What the loop reads: the source, the collator, the row split and lengths."""

    source: Any
    collate: Collator
    train: list[int]
    val: list[int]
    lengths: list[int]


class Trainer:
    """One training run (one per process under torchrun). Build, then :meth:`fit`."""

    def __init__(self, cfg: TrainConfig, env: StageContext, objective: Objective, model: nn.Module,
                 data: Data, out_dir: Path) -> None:
        self.cfg, self.env, self.objective, self.model = cfg, env, objective, model
        self.data, self.out = data, Path(out_dir)
        self.dtype = resolve_train_dtype(cfg.dtype, env.device.type,
                                         objective.drafter.config.hidden_size)
        self.optimizer = make_optimizer(model, cfg)
        self._plans: dict[int, list[MicroBatch]] = {}
        self.G = env.world_size * cfg.grad_accum
        # Shuffled length windows pack into a slightly different number of micro-batches each
        # epoch: every epoch runs the same number of steps, that of the smallest plan.
        n_micro = min(len(plan_epoch(data.train, data.lengths, batch_tokens=cfg.batch_tokens,
                                     length_window=cfg.length_window, seed=cfg.seed, epoch=e))
                      for e in range(cfg.epochs))
        self.steps_per_epoch = n_micro // self.G
        if self.steps_per_epoch == 0:
            raise ValueError(f"{n_micro} micro-batches per epoch < world_size*grad_accum = "
                             f"{self.G}: lower --batch-tokens or --grad-accum")
        self.dropped_per_epoch = n_micro - self.steps_per_epoch * self.G
        total = self.steps_per_epoch * cfg.epochs
        self.total_steps = min(total, cfg.max_steps) if cfg.max_steps else total
        self.warmup = warmup_steps(cfg, self.total_steps)
        lam = lambda s: lr_factor(s, warmup=self.warmup, total=self.total_steps,  # noqa: E731
                                  min_ratio=cfg.min_lr_ratio)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lam)
        self.step, self.epoch, self.step_in_epoch = 0, 0, 0
        self.tokens_seen, self.best_tau, self.best_step = 0, -1.0, None
        self.last_val: dict[str, Any] | None = None
        self.best_val: dict[str, Any] | None = None
        self.resume_changes: dict[str, list[Any]] = {}
        self._expected: int | None = None  # the epoch a prefetching source was told of

    # ----- data -----
    def plan(self, epoch: int) -> list[MicroBatch]:
        if epoch not in self._plans:
            self._plans = {epoch: plan_epoch(
                self.data.train, self.data.lengths, batch_tokens=self.cfg.batch_tokens,
                length_window=self.cfg.length_window, seed=self.cfg.seed, epoch=epoch)}
        return self._plans[epoch]

    def rows_ahead(self) -> list[int]:
        """This rank's rows, in the order its steps load them, from this step to the end of
        the epoch (or of the run): what a prefetching source captures ahead."""
        last = min(self.steps_per_epoch, self.step_in_epoch + self.total_steps - self.step)
        return [i for s in range(self.step_in_epoch, last)
                for mb in rank_micro_batches(self.plan(self.epoch), s, self.env.rank,
                                             self.env.world_size, self.cfg.grad_accum)
                for i in mb]

    def load(self, mb: MicroBatch):
        return self.data.collate(self.data.source.get_batch(list(mb)))

    def load_train(self, mb: MicroBatch):
        """:meth:`load`, then the training-only noise on the aux states (``hidden_noise``)."""
        batch = self.load(mb)
        if not self.cfg.hidden_noise:
            return batch
        aux = noised_aux_hidden(batch.aux_hidden, mb, [self.data.lengths[i] for i in mb],
                                len(self.data.source.aux_layer_ids), self.cfg.hidden_noise,
                                self.cfg.seed, self.step)
        return dataclasses.replace(batch, aux_hidden=aux)

    def autocast(self):
        return autocast_context(self.dtype, self.env.device)

    # ----- one optimizer step -----
    def train_step(self, window: Window) -> float:
        """Forward/backward over this rank's micro-batches, clip, step. Returns the grad norm."""
        mbs = rank_micro_batches(self.plan(self.epoch), self.step_in_epoch, self.env.rank,
                                 self.env.world_size, self.cfg.grad_accum)
        expect = getattr(self.data.source, "expect", None)  # a prefetching source
        if expect is not None and self._expected != self.epoch:
            self._expected = self.epoch
            expect(self.rows_ahead())
        batches = [self.load_train(mb) for mb in mbs]
        self.model.train()  # before loss_counts: DFlash draws its training anchors there,
        self.objective.step = self.step  # from generators seeded by the step (and the row)
        counts = sum(self.objective.loss_counts(b) for b in batches)  # [S]
        norm = all_reduce_sum(counts.clone(), self.env).clamp(min=1) / self.env.world_size
        for i, batch in enumerate(batches):
            sync = i == len(batches) - 1
            ctx = self.model.no_sync() if (not sync and hasattr(self.model, "no_sync")) \
                else contextlib.nullcontext()
            with ctx, self.autocast():
                out = self.model(batch, norm)
            with ctx:
                out.loss.backward()
            window.counts += hit_counts(out.hits, out.sup).cpu()
            window.loss_sum += out.loss_sum.double().cpu()
            window.tokens += batch.n_real
        window.loss_count += counts.double().cpu()
        params = [p for p in self.model.parameters() if p.requires_grad]
        gnorm = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip or float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        gnorm = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
        return float(gnorm)

    # ----- validation -----
    @torch.no_grad()
    def evaluate(self) -> dict[str, Any] | None:
        """Metrics on the validation rows (all ranks; None without a validation split)."""
        plan = plan_eval(self.data.val, self.data.lengths, self.cfg.batch_tokens)
        if not plan:
            return None
        S, W = self.objective.steps, self.env.world_size
        counts = torch.zeros(4, S, dtype=torch.float64, device=self.env.device)
        sums = torch.zeros(2, S, dtype=torch.float64, device=self.env.device)
        self.model.eval()
        for i in range(math.ceil(len(plan) / W)):  # same number of forwards on every rank
            j = i * W + self.env.rank
            batch = self.load(plan[j if j < len(plan) else 0])
            n = self.objective.loss_counts(batch)
            with self.autocast():
                out = self.model(batch, n.clamp(min=1))
            if j < len(plan):
                counts += hit_counts(out.hits, out.sup).to(counts.device)
                sums += torch.stack([out.loss_sum.double(), n.double()])
        all_reduce_sum(counts, self.env)
        all_reduce_sum(sums, self.env)
        return self.record(counts.cpu(), sums[0].cpu(), sums[1].cpu())

    def record(self, counts: torch.Tensor, loss_sum: torch.Tensor, loss_count: torch.Tensor
               ) -> dict[str, Any]:
        """Metrics dict: per-step loss/acc/cond_acc, weighted loss, ``tau``."""
        m = summarize(counts)
        per_step = (loss_sum / loss_count.clamp(min=1)).tolist()
        m["loss_k"] = per_step
        m["loss"] = sum(w * l for w, l in zip(self.objective.weights, per_step))
        m["supervised"] = int(counts[0, 0])
        return m

    # ----- checkpoints -----
    def train_state(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                "tokens_seen": self.tokens_seen, "best_tau": self.best_tau,
                "best_step": self.best_step, "best_val": self.best_val,
                "last_val": self.last_val, "scheduler": self.scheduler.state_dict(),
                "rng": ckpt.rng_state(), "world_size": self.env.world_size,
                "config_hash": self.cfg.config_hash(), "config": self.cfg.to_dict()}

    def full_drafter(self) -> tuple[Drafter, dict]:
        """(a full drafter to save, the full optimizer state); collective under FSDP."""
        model_state, optim_state = full_states(self.model, self.optimizer)
        if not is_fsdp(self.model):
            return self.objective.drafter, optim_state
        if not self.env.is_main:  # full FSDP states are materialised on rank 0 only
            return None, optim_state
        drafter = type(self.objective.drafter)(self.objective.drafter.config)
        state = {k.removeprefix("drafter."): v for k, v in model_state.items()}
        missing, unexpected = drafter.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise RuntimeError(f"FSDP full state: missing {missing}, unexpected {unexpected}; "
                               f"got keys {sorted(model_state)[:4]}...")
        return drafter, optim_state

    def save(self) -> None:
        drafter, optim_state = self.full_drafter()
        if self.env.is_main:
            state = {**self.train_state(), "optimizer": optim_state}
            ckpt.save_checkpoint(self.out / "checkpoints", self.step, drafter, state)
            ckpt.prune(self.out / "checkpoints", self.cfg.keep_checkpoints)
        barrier(self.env)

    def save_drafter_dir(self, name: str) -> None:
        """``RUN/train/<name>/``: the drafter and its ``provenance.json`` (config hash, step,
        validation τ̂ of that step)."""
        drafter, _ = self.full_drafter()
        if self.env.is_main:
            save_drafter(drafter, self.out / name)
            write_provenance(self.out / name, stage="train", config=self.cfg, step=self.step,
                             val=self.last_val, best_step=self.best_step)
        barrier(self.env)

    def restore(self) -> bool:
        """Load the newest usable checkpoint; False when there is none.

        Its settings are compared with this run's first (:func:`check_checkpoint_settings`):
        a refused change raises :class:`StageDirError` before any state is loaded; the allowed
        ones are kept in ``resume_changes`` for the manifest."""
        found = ckpt.load_latest(self.out / "checkpoints")
        if found is None:
            return False
        drafter, state, path = found
        self.resume_changes = check_checkpoint_settings(state, self.cfg, self.env, path)
        model_state = {f"drafter.{k}": v for k, v in drafter.state_dict().items()}
        load_full_states(self.model, self.optimizer, model_state, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        for key in ("step", "epoch", "step_in_epoch", "tokens_seen", "best_tau", "best_step",
                    "best_val", "last_val"):
            setattr(self, key, state[key])
        return True


def check_checkpoint_settings(state: dict[str, Any], cfg: TrainConfig, env: StageContext,
                              path: Path) -> dict[str, list[Any]]:
    """The allowed setting changes between the checkpoint at ``path`` and ``cfg``
    (:func:`specdraft.core.resume.check_resume_settings`). Raises :class:`StageDirError` on any
    other change, on a changed number of processes (the data plan depends on it), and, for a
    checkpoint that records only its settings' hash (written before the settings were kept),
    on a different hash."""
    where = path / ckpt.STATE_FILE
    if state.get("world_size", env.world_size) != env.world_size:
        raise StageDirError(f"--resume with {env.world_size} processes but {where} was written "
                            f"by {state['world_size']} (the data plan depends on it); resume "
                            f"with the same number, or start over with --overwrite or a new "
                            f"--run-dir")
    if "config" in state:
        return check_resume_settings(state["config"], cfg, stage="train", where=where)
    if state["config_hash"] != cfg.config_hash():
        raise StageDirError(f"--resume with settings whose hash {cfg.config_hash()} differs from "
                            f"{state['config_hash']} recorded in {where} (an older checkpoint: "
                            f"it records no settings to name the change); resume with the "
                            f"stored settings, or start over with --overwrite or a new --run-dir")
    return {}


def trim_metrics(path: Path, step: int) -> None:
    """Keep only the records of ``path`` with ``step <= step`` (after a resume)."""
    if not path.exists():
        return
    import json

    kept = [rec for _, rec in iter_jsonl(path) if rec.get("step", 0) <= step]
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)


class Logger:
    """metrics.jsonl and the ``--report-to`` trackers (:mod:`specdraft.train.trackers`; rank 0
    only); every record carries ``step`` and ``split``, and every tracker gets its numbers."""

    def __init__(self, out: Path, env: StageContext, start_step: int, *,
                 report_to: tuple[str, ...] = ("tensorboard",),
                 config: dict[str, Any] | None = None) -> None:
        self.env = env
        self.jsonl, self.trackers = None, []
        if env.is_main:
            from specdraft.train.trackers import open_trackers

            trim_metrics(out / "metrics.jsonl", start_step)
            self.jsonl = JsonlWriter(out / "metrics.jsonl")
            self.trackers = open_trackers(report_to, out, run_name=out.parent.name,
                                          config=config or {}, start_step=start_step)

    def write(self, step: int, split: str, values: dict[str, Any]) -> None:
        if not self.env.is_main:
            return
        from specdraft.train.trackers import scalars

        self.jsonl.write_batch([{"step": step, "split": split, **values}])
        numbers = scalars(split, values)
        for tracker in self.trackers:
            tracker.log(numbers, step)

    def close(self) -> None:
        if self.env.is_main:
            self.jsonl.close()
            for tracker in self.trackers:
                tracker.close()


def log_window(tr: Trainer, window: Window, logger: Logger, gnorm: float) -> Window:
    """All-reduce the window's figures, write one train record, start a new window."""
    env = tr.env
    packed = torch.cat([window.counts.flatten(), window.loss_sum, window.loss_count,
                        torch.tensor([float(window.tokens)], dtype=torch.float64)])
    packed = all_reduce_sum(packed.to(env.device), env).cpu()
    S = tr.objective.steps
    counts, rest = packed[:4 * S].view(4, S), packed[4 * S:]
    m = tr.record(counts, rest[:S], rest[S:2 * S])
    elapsed = time.monotonic() - window.t0
    m.update(lr=tr.scheduler.get_last_lr()[0], grad_norm=gnorm, epoch=tr.epoch,
             tokens_per_s=float(rest[-1]) / max(elapsed, 1e-9),
             peak_memory_mb=peak_memory_mb(env.device))
    logger.write(tr.step, "train", m)
    return Window(S)


def validate(tr: Trainer, logger: Logger) -> None:
    """Evaluate; keep ``best/`` when validation ``τ̂`` improves."""
    m = tr.evaluate()
    if m is None:
        return
    tr.last_val = m
    logger.write(tr.step, "val", m)
    if m["tau"] > tr.best_tau:
        tr.best_tau, tr.best_step, tr.best_val = m["tau"], tr.step, m
        tr.save_drafter_dir("best")


def train_postfix(tr: Trainer) -> dict[str, str]:
    """The train progress fields: epoch, and the last validation ``τ̂`` (with its step) once
    one was measured."""
    out = {"epoch": str(tr.epoch)}
    if tr.last_val is not None:
        out["validation τ̂"] = f"{tr.last_val['tau']:.3f}"
    return out


def fit(tr: Trainer, *, resume: bool = False) -> dict[str, Any]:
    """Train to ``total_steps``; returns run figures for the manifest."""
    resumed = tr.restore() if resume else False
    from specdraft.train.trackers import parse_report_to

    logger = Logger(tr.out, tr.env, tr.step, report_to=parse_report_to(tr.cfg.report_to),
                    config=tr.cfg.to_dict())
    if tr.env.is_main:
        why = " (--dtype auto: resolve_train_dtype)" if tr.cfg.dtype == "auto" else ""
        print(f"train: compute dtype {tr.dtype}{why}", flush=True)
    bar = StageProgress("train", total=tr.total_steps, initial=tr.step, unit="steps",
                        enabled=tr.env.is_main).start()
    window, gnorm, t0 = Window(tr.objective.steps), 0.0, time.monotonic()
    tokens0 = tr.tokens_seen
    try:
        while tr.step < tr.total_steps:
            before = window.tokens
            gnorm = tr.train_step(window)
            tr.tokens_seen += window.tokens - before
            tr.step += 1
            tr.step_in_epoch += 1
            if tr.step_in_epoch == tr.steps_per_epoch:
                tr.epoch, tr.step_in_epoch = tr.epoch + 1, 0
            if tr.step % tr.cfg.log_every == 0:
                window = log_window(tr, window, logger, gnorm)
            if tr.step % tr.cfg.eval_every == 0:
                validate(tr, logger)
            if tr.step % tr.cfg.save_every == 0:
                tr.save()
            bar.update(1, **train_postfix(tr))
        if tr.step % tr.cfg.eval_every != 0 or tr.last_val is None:
            validate(tr, logger)
    except BaseException:
        bar.close(final=False)
        raise
    bar.update(0, emit=False, **train_postfix(tr))
    bar.close()
    if not ckpt.list_checkpoints(tr.out / "checkpoints") or \
            ckpt.list_checkpoints(tr.out / "checkpoints")[-1][0] != tr.step:
        tr.save()
    tr.save_drafter_dir("last")
    if tr.best_step is None:
        tr.save_drafter_dir("best")
    logger.close()
    elapsed = time.monotonic() - t0
    tokens = all_reduce_sum(torch.tensor([float(tr.tokens_seen - tokens0)],
                                         device=tr.env.device), tr.env).item()
    return {"resumed": resumed, "resume_changes": tr.resume_changes, "compute_dtype": tr.dtype,
            "steps": tr.step, "epochs_done": tr.epoch,
            "steps_per_epoch": tr.steps_per_epoch, "total_steps": tr.total_steps,
            "warmup_steps": tr.warmup,
            "dropped_micro_batches_per_epoch": tr.dropped_per_epoch,
            "tokens_per_s": tokens / max(elapsed, 1e-9),
            "peak_memory_mb": peak_memory_mb(tr.env.device),
            "final_val": tr.last_val, "best_val": tr.best_val, "best_step": tr.best_step}
