"""Settings of ``specdraft export`` (field names = CLI flags with ``_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from specdraft.core.config import StageConfig


class ExportConfig(StageConfig):
    """Settings of the export stage: the engine format, the output directory and whether the
    verifier's embedding is copied into the checkpoint.

    The trained drafter is ``drafter`` (a specdraft drafter directory) or ``RUN/train/best``.
    ``out`` defaults to ``RUN/export/<format>``. ``embed``: ``copy`` writes the verifier's
    embedding (from ``RUN/extract/verifier_head.safetensors`` or ``--verifier``), ``omit`` leaves
    it out (both engines then share the verifier's), ``auto`` copies when the verifier's
    embedding is known. ``verifier_name`` is written as the speculators format's
    ``verifier.name_or_path`` (default: ``--verifier``). ``dtype``: ``auto`` keeps the trained
    dtype of the float tensors.
    """

    run_dir: Path | None = None
    drafter: Path | None = None
    format: Literal["sglang", "vllm", "speculators"] = "sglang"
    out: Path | None = None
    verifier: str | None = None
    verifier_name: str | None = None
    embed: Literal["auto", "copy", "omit"] = "auto"
    speculative_tokens: int = Field(3, ge=1)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    aux_layers: tuple[int, ...] | None = None
    overwrite: bool = False

    @field_validator("aux_layers", mode="before")
    @classmethod
    def _parse_aux(cls, v: object) -> object:
        if isinstance(v, str):
            try:
                return tuple(int(x) for x in v.split(",") if x.strip())
            except ValueError:
                raise ValueError(f"expected comma-separated layer ids like 2,15,27, got {v!r}")
        return v

    @model_validator(mode="after")
    def _need_source(self) -> "ExportConfig":
        if self.run_dir is None and self.drafter is None:
            raise ValueError("give --run-dir RUN (reads RUN/train/best) or --drafter DIR")
        if self.run_dir is None and self.out is None:
            raise ValueError("--out DIR is required when no --run-dir is given")
        return self
