"""Settings of ``specdraft extract`` (field names = CLI flags with ``_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from specdraft.core.config import StageConfig


class ExtractConfig(StageConfig):
    """Settings of the extract stage: which aux hidden states to capture, batch token budget,
    storage format and shard size, and how many rows to re-verify.

    ``aux_layers`` accepts a list or a comma-separated string (``"2,15,27"``); None means the
    default ``[2, N//2, N-3]`` of an N-layer verifier. ``shard_mb`` bounds the uncompressed size
    of a shard (MiB). ``verify`` recomputes that many random rows one at a time at the end.
    """

    run_dir: Path
    verifier: str = "smollm2"
    aux_layers: tuple[int, ...] | None = None
    batch_tokens: int = Field(4096, ge=1)
    storage: Literal["fp32", "bf16", "fp8", "bf16-zstd", "fp8-zstd"] = "bf16"
    zstd_level: int = Field(3, ge=1, le=22)
    shard_mb: float = Field(512.0, gt=0)
    verify: int = Field(0, ge=0)
    seed: int = 0
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    device: str = "auto"
    device_map: str | None = None
    trust_remote_code: bool = False
    resume: bool = False
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

    @field_validator("device")
    @classmethod
    def _check_device(cls, v: str) -> str:
        if v != "auto" and v.split(":")[0] not in ("cpu", "cuda", "mps", "xpu"):
            raise ValueError(f"expected auto, cpu, cuda or cuda:N, got {v!r}")
        return v
