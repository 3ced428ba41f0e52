"""Settings of ``specdraft eval`` (field names = CLI flags with ``_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from specdraft.core.config import StageConfig


class EvalConfig(StageConfig):
    """Settings of the eval stage: the prompts, draft length k, temperature and length limits
    of offline speculative decoding (or a live server to read metrics from).

    The drafter is ``drafter`` or, with only ``run_dir``, ``RUN/train/best``; results go to
    ``RUN/eval/`` or, without a run dir, ``out``. The benchmark prompts are MT-bench
    (``mt_bench/question.jsonl``) and GSM8K test.
    """

    run_dir: Path | None = Field(None, description="Run directory; reads RUN/train/best, "
                                                   "writes RUN/eval/.")
    drafter: Path | None = Field(None, description="Drafter directory (specdraft's or an "
                                                   "export) instead of RUN/train/best.")
    verifier: str = Field("smollm2", description="HF model dir, .gguf file or smollm2.")
    prompts: Path = Field(description="Any prompt file generate reads (first user turn, with "
                                      "its system prompt), or builtin:NAME.")
    k: int = Field(4, ge=1, le=64, description="Draft tokens per verify step.")
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy; > 0 = speculative "
                                                        "sampling.")
    max_new_tokens: int = Field(128, ge=1, description="New tokens per prompt.")
    limit: int | None = Field(None, ge=1, description="Use the first N prompts only.")
    seed: int = Field(0, description="Sampling seed.")
    device: str = Field("cpu", description="cpu, cuda or cuda:N.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="Dtype of both "
                                                                              "models.")
    server: str | None = Field(None, description="URL of a running vLLM/SGLang serving the "
                                                 "drafter: read its acceptance counters "
                                                 "instead (no local models).")
    out: Path | None = Field(None, description="Output directory when there is no --run-dir.")
    overwrite: bool = Field(False, description="Replace earlier results.")

    @model_validator(mode="after")
    def _where(self) -> "EvalConfig":
        if self.server is None and self.run_dir is None and self.drafter is None:
            raise ValueError("give --run-dir RUN, --drafter DIR or --server URL")
        if self.run_dir is None and self.out is None:
            raise ValueError("--out DIR is required without --run-dir")
        return self
