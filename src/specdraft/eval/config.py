"""Settings of ``specdraft eval`` (field names = CLI flags with ``_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from specdraft.core.config import StageConfig, parse_json_object


class EvalConfig(StageConfig):
    """Settings of the eval stage: the prompts, draft length k, temperature and length limits
    of offline speculative decoding (or a live server to read metrics from).

    The drafter is ``drafter`` (a specdraft drafter directory or an exported one) or, with only
    ``run_dir``, ``RUN/train/best``. Results go to ``RUN/eval/`` or, without a run dir, ``out``.
    ``prompts``: JSONL with question / turns (first turn) / prompt / messages — the benchmark
    defaults are MT-bench (``mt_bench/question.jsonl``) and GSM8K test. ``k`` drafts per verify
    step; ``temperature`` 0 = greedy, > 0 = speculative sampling. ``server``: measure on a
    running vLLM/SGLang instead (no local models). Prompts are rendered with the run's chat
    format (``RUN/prepare/chat_format.json``: template and ``chat_template_kwargs`` of the training
    data), else the verifier's; ``chat_template`` (a file) and ``chat_template_kwargs`` (JSON)
    override it.

    ``engine``: also measure with a real engine started for the eval (``vllm``: in a
    subprocess with ``engine_python``, default env ``SPECDRAFT_VLLM_PYTHON``, this python if it
    has vllm, else ``REPO/.venv-vllm``; ``sglang``: a launched server) on the same prompt token
    ids; its figures are written beside the offline ones; ``auto``: vllm when a python with
    vLLM is found (as for ``engine_python``), else none. ``engine_drafter``: the exported
    directory the engine loads (default: the ``drafter`` when it is an export, else the run's
    export, else one exported into the eval directory). At temperature 0 a τ gap beyond
    ``engine_tolerance`` (absolute) fails the eval; in float32 on CPU the gap is exactly 0.
    """

    run_dir: Path | None = None
    drafter: Path | None = None
    verifier: str = "smollm2"
    prompts: Path
    k: int = Field(4, ge=1, le=64)
    temperature: float = Field(0.0, ge=0.0)
    max_new_tokens: int = Field(128, ge=1)
    limit: int | None = Field(None, ge=1)
    seed: int = 0
    device: str = "cpu"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    server: str | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    engine: Literal["none", "auto", "vllm", "sglang"] = "none"
    engine_python: str | None = None
    engine_drafter: Path | None = None
    engine_tolerance: float = Field(0.05, ge=0.0)
    engine_timeout_s: int = Field(3600, ge=1)
    out: Path | None = None
    overwrite: bool = False

    @field_validator("chat_template_kwargs", mode="before")
    @classmethod
    def _parse_kwargs(cls, value: Any) -> Any:
        return parse_json_object(value)

    @model_validator(mode="after")
    def _where(self) -> "EvalConfig":
        if self.server is None and self.run_dir is None and self.drafter is None:
            raise ValueError("give --run-dir RUN, --drafter DIR or --server URL")
        if self.server is not None and self.engine != "none":
            raise ValueError("--server and --engine exclude each other (--engine starts one)")
        if self.run_dir is None and self.out is None:
            raise ValueError("--out DIR is required without --run-dir")
        return self
