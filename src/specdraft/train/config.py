"""Settings of ``specdraft train``: one frozen config, field names = CLI flag names."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from specdraft.core.config import StageConfig


class TrainConfig(StageConfig):
    """Settings of the training stage (defaults follow the EAGLE-3 official recipe where one
    exists: AdamW β 0.9/0.95, grad clip 0.5, 7 TTT steps weighted ``0.8**k``; arXiv 2503.01840 and
    SafeAILab/EAGLE ``eagle/traineagle3/``).

    Batching: a micro-batch holds at most ``batch_tokens`` padded tokens (rows × longest row);
    one optimizer step consumes ``grad_accum`` micro-batches on each of the ``world_size`` ranks,
    so the global batch is ``world_size * grad_accum`` micro-batches (1 process with
    ``grad_accum=2`` and 2 processes with ``grad_accum=1`` see the same global batch).
    """

    run_dir: Path
    epochs: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps")
    ttt_steps: int = Field(7, ge=1)
    step_weight: float = Field(0.8, gt=0, description="loss weight of TTT step k is this ** k")
    loss: Literal["soft", "hard"] = "soft"
    oov_policy: Literal["mask", "keep"] = "mask"
    lr: float = Field(1e-4, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup_steps: int = Field(100, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    grad_clip: float = Field(0.5, ge=0, description="max grad norm; 0 disables clipping")
    batch_tokens: int = Field(8192, ge=2)
    grad_accum: int = Field(1, ge=1)
    length_window: int = Field(64, ge=1, description="rows sorted by length within windows")
    val_fraction: float = Field(0.05, ge=0, lt=1)
    eval_every: int = Field(500, ge=1)
    save_every: int = Field(500, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    log_every: int = Field(10, ge=1)
    seed: int = 0
    attn_impl: Literal["dense", "split"] = "split"
    norm_before_residual: bool = False
    parallel: Literal["ddp", "fsdp"] = "ddp"
    device: str | None = None
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    online: bool = False
    verifier: str | None = None
    aux_layers: tuple[int, ...] | None = None
    resume: bool = False
    overwrite: bool = False

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.loss == "hard" and self.oov_policy == "keep":
            raise ValueError("--oov-policy keep needs --loss soft: a hard label outside the "
                             "draft vocabulary has no class to train")
        if self.online and not self.verifier:
            raise ValueError("--online needs --verifier (the model run inside the training step)")
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite exclude each other")
        return self

    def step_weights(self) -> list[float]:
        """``[step_weight**k for k in range(ttt_steps)]``."""
        return [self.step_weight ** k for k in range(self.ttt_steps)]
