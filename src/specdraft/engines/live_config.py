"""Settings of ``specdraft serve`` (:mod:`specdraft.engines.live`), apart so that the CLI
imports them without the server code."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from specdraft.core.config import StageConfig, parse_layer_ids


class ServeConfig(StageConfig):
    """Settings of ``specdraft serve`` (field names = CLI flags with ``_``)."""

    run_dir: Path = Field(description="Run directory: its verifier (RUN/verifier.json), chat "
                                      "format and aux ids; the server's log goes to RUN/serve/.")
    verifier: str | None = Field(None, description="HF model dir, .gguf or smollm2 (none: the "
                                                   "run's verifier).")
    aux_layers: tuple[int, ...] | None = Field(
        None, description="Aux layer ids to capture (none: RUN/extract's, else 2,N//2,N-3).")
    host: str = Field("127.0.0.1", description="Address the server listens on.")
    port: int = Field(8000, ge=1, le=65535, description="Port the server listens on.")
    served_model_name: str | None = Field(None, description="Model name clients send (none: "
                                                            "the verifier directory's name).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="The verifier's dtype in vLLM.")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor parallel size.")
    pipeline_parallel_size: int = Field(1, ge=1, description="vLLM pipeline parallel size.")
    data_parallel_size: int = Field(1, ge=1, description="vLLM data parallel size.")
    max_model_len: int | None = Field(None, ge=2, description="vLLM --max-model-len (none: "
                                                               "the model's).")
    capture_dir: Path | None = Field(None, description="Default directory of captured states "
                                                       "(requests name their own path; none: "
                                                       "RUN/serve/capture).")
    reasoning_parser: str = Field("auto", description="vLLM reasoning parser: auto (the "
                                                      "family's when the chat format has think "
                                                      "markers), none, or a parser name.")
    trust_remote_code: bool = Field(False, description="Allow the verifier's own code.")
    extra_args: str = Field("", description="More vllm serve flags, shell-quoted, appended "
                                            "last (e.g. '--enforce-eager --max-num-seqs 64').")
    engine_python: str | None = Field(None, description="Python with vLLM (none: env "
                                                        "SPECDRAFT_VLLM_PYTHON, this python, "
                                                        "else REPO/.venv-vllm).")
    startup_s: float = Field(1800.0, gt=0, description="Seconds the server may take to answer "
                                                       "/health.")

    @field_validator("aux_layers", mode="before")
    @classmethod
    def _parse_aux(cls, v: object) -> object:
        return parse_layer_ids(v)
