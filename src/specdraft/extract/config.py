"""Settings of ``specdraft extract`` (field names = CLI flags with ``_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from specdraft.core.config import StageConfig, check_http_urls, parse_layer_ids
from specdraft.core.jsonl import parse_json


class ExtractConfig(StageConfig):
    """Settings of the extract stage: which aux hidden states to capture, batch token budget,
    storage format and shard size, and how many rows to re-verify.

    ``backend``: ``transformers`` (the verifier in this process) or ``vllm`` (a vLLM engine in a
    subprocess run by ``engine_python``), with ``tensor_parallel_size`` /
    ``pipeline_parallel_size`` per engine replica and ``engine_args``; an engine that makes no
    progress for ``engine_no_progress_s`` seconds is stopped and the stage fails. ``endpoint``:
    running ``specdraft serve`` servers capture instead (:mod:`specdraft.extract.endpoint`).
    All three write the same artifacts.
    """

    run_dir: Path = Field(description="Run directory; reads RUN/prepare/, writes RUN/extract/.")
    verifier: str = Field("smollm2", description="HF model dir, .gguf file or smollm2.")
    aux_layers: tuple[int, ...] | None = Field(
        None, description="Aux layer ids, comma-separated (id i = the input to decoder layer "
                          "i = HF hidden_states[i]; none: 2,N//2,N-3 of an N-layer verifier).")
    batch_tokens: int = Field(4096, ge=1, description="Padded tokens per forward (rows x "
                                                      "longest row).")
    storage: Literal["fp32", "bf16", "fp8", "bf16-zstd", "fp8-zstd"] = Field(
        "bf16", description="How hidden states are stored (fp8 = e4m3 with per-token scales; "
                            "*-zstd: lossless compression on top).")
    zstd_level: int = Field(3, ge=1, le=22, description="Zstandard level for *-zstd storage.")
    shard_mb: float = Field(512.0, gt=0, description="Largest uncompressed shard, MiB.")
    verify: int = Field(0, ge=0, description="At the end, recompute this many random rows one "
                                             "at a time and compare.")
    seed: int = Field(0, description="Seed of the --verify sample.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="The verifier's "
                                                                              "dtype.")
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N.")
    device_map: str | None = Field(None, description="HF device_map, e.g. auto: spread a large "
                                                     "verifier over the GPUs.")
    trust_remote_code: bool = Field(False, description="Allow the verifier's own code.")
    verifier_fingerprint: Literal["sampled", "full"] = Field(
        "sampled", description="Verifier identity's weight fingerprint: sampled (1 KiB of "
                               "every tensor) or full (every byte hashed, at the disk's read "
                               "speed: docs/verifier-binding.md).")
    resume: bool = Field(False, description="Continue a killed run (finished shards are kept).")
    overwrite: bool = Field(False, description="Delete RUN/extract and start over.")
    backend: Literal["transformers", "vllm"] = Field(
        "transformers", description="transformers (the verifier in this process) or vllm (a "
                                    "vLLM engine in a subprocess).")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor parallel size per "
                                                           "engine replica.")
    pipeline_parallel_size: int = Field(1, ge=1, description="vLLM pipeline parallel size per "
                                                             "engine replica.")
    engine_args: dict[str, Any] = Field(default_factory=dict,
                                        description="JSON object of extra vllm.LLM arguments.")
    engine_python: str | None = Field(None, description="Python with vLLM (none: env "
                                                        "SPECDRAFT_VLLM_PYTHON, this python, "
                                                        "else REPO/.venv-vllm).")
    engine_no_progress_s: float = Field(
        600.0, gt=0, description="Seconds the vLLM engine may go without progress (no line in "
                                 "its log, no row's states arriving) before extract stops it "
                                 "and fails.")

    endpoint: list[str] = Field(
        default_factory=list, description="Running `specdraft serve` URLs (repeat or comma-"
                                          "separate): capture through them, rows spread over "
                                          "them; no engine is started here.")
    capture_dir: Path | None = Field(
        None, description="--endpoint: where the servers write each row's states (storage both "
                          "the servers and this process see; none: RUN/extract/live).")
    endpoint_concurrency: int = Field(4, ge=1, description="--endpoint: requests in flight per "
                                                          "server.")
    endpoint_timeout_s: float = Field(
        600.0, gt=0, description="--endpoint: seconds one row may take on a server (request "
                                 "and file) before its rows go to the others; with no server "
                                 "left, how long to wait for one to come back.")

    @field_validator("endpoint")
    @classmethod
    def _http_endpoints(cls, v: list[str], info: ValidationInfo) -> list[str]:
        check_http_urls(v)
        if v and info.data.get("backend") == "vllm":
            raise ValueError("--endpoint captures through running servers; --backend vllm "
                             "starts an engine of its own: pass one of them")
        return v

    @field_validator("engine_args", mode="before")
    @classmethod
    def _parse_engine_args(cls, v: object) -> object:
        if isinstance(v, str):
            try:
                v = parse_json(v) if v.strip() else {}
            except ValueError as err:
                raise ValueError(f"expected a JSON object like '{{\"max_num_seqs\": 64}}': {err}")
            if not isinstance(v, dict):
                raise ValueError(f"expected a JSON object, got {type(v).__name__}")
        return v

    @field_validator("aux_layers", mode="before")
    @classmethod
    def _parse_aux(cls, v: object) -> object:
        return parse_layer_ids(v)

    @field_validator("device")
    @classmethod
    def _check_device(cls, v: str) -> str:
        if v != "auto" and v.split(":")[0] not in ("cpu", "cuda", "mps", "xpu"):
            raise ValueError(f"expected auto, cpu, cuda or cuda:N, got {v!r}")
        return v
