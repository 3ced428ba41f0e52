"""Settings of ``specdraft extract`` (field names = CLI flags with ``_``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from specdraft.core.config import StageConfig


class ExtractConfig(StageConfig):
    """Settings of the extract stage: which aux hidden states to capture, batch token budget,
    storage format and shard size, and how many rows to re-verify.

    ``aux_layers`` accepts a list or a comma-separated string (``"2,15,27"``); None means the
    default ``[2, N//2, N-3]`` of an N-layer verifier. ``shard_mb`` bounds the uncompressed size
    of a shard (MiB). ``verify`` recomputes that many random rows one at a time at the end.

    ``backend``: ``transformers`` (the verifier in this process) or ``vllm`` (a vLLM engine in a
    subprocess run by ``engine_python``, default env ``SPECDRAFT_VLLM_PYTHON``, else this
    interpreter when it has vllm, else ``REPO/.venv-vllm/bin/python``), with
    ``tensor_parallel_size`` / ``pipeline_parallel_size`` per engine replica and ``engine_args``
    (a JSON object of extra ``vllm.LLM`` keyword arguments). Both write the same artifacts.
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
    backend: Literal["transformers", "vllm"] = "transformers"
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    engine_python: str | None = None

    @field_validator("engine_args", mode="before")
    @classmethod
    def _parse_engine_args(cls, v: object) -> object:
        if isinstance(v, str):
            try:
                v = json.loads(v) if v.strip() else {}
            except json.JSONDecodeError as err:
                raise ValueError(f"expected a JSON object like '{{\"max_num_seqs\": 64}}': {err}")
            if not isinstance(v, dict):
                raise ValueError(f"expected a JSON object, got {type(v).__name__}")
        return v

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
