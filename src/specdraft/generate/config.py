"""Settings of ``specdraft generate`` (field names = CLI flag names with ``_``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from specdraft.core.chat import DEFAULT_THINK
from specdraft.core.config import StageConfig

#: Input field kinds and the column each is read from by default (override with ``--field``).
DEFAULT_FIELDS: dict[str, str] = {
    "messages": "messages",          # OpenAI chat messages [{"role", "content"}]
    "conversations": "conversations",  # ShareGPT [{"from", "value"}]
    "turns": "turns",                # MT-bench: several user turns
    "question": "question",          # GSM8K
    "prompt": "prompt",              # a single user prompt
    "system": "system",              # optional system prompt column
    "id": "id",                      # optional given sample id (else `question_id`, else a hash)
}


class GenerateConfig(StageConfig):
    """Settings of the generate stage: the prompt file, the backend (the verifier in-process, or
    OpenAI-compatible servers), sampling, chat-template arguments and reasoning checks.

    ``backend="local"`` runs the verifier in-process (``verifier``, ``device``, ``dtype``,
    ``batch_size``); ``backend="openai"`` sends ``/v1/chat/completions`` requests to
    ``endpoint`` (one or more base URLs) with at most ``concurrency`` in flight.
    """

    prompts: str
    run_dir: str
    backend: Literal["openai", "local"] = "local"
    # openai backend
    endpoint: list[str] = Field(default_factory=list, validate_default=True)
    model: str | None = None
    api_key_env: str | None = None
    concurrency: int = Field(64, ge=1)
    timeout_s: float = Field(600.0, gt=0)
    max_retries: int = Field(5, ge=0)
    backoff_base_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(60.0, ge=0)
    return_token_ids: bool = True
    extra_body: dict[str, Any] = Field(default_factory=dict)
    # local backend
    verifier: str = "smollm2"
    device: str = "cpu"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    batch_size: int = Field(8, ge=1)
    # sampling and chat template
    max_tokens: int = Field(2048, ge=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    system_prompt: str | None = None
    # inputs
    fields: dict[str, str] = Field(default_factory=dict)
    limit: int | None = Field(None, ge=1)
    # reasoning
    think_open: str = Field(DEFAULT_THINK[0], min_length=1)
    think_close: str = Field(DEFAULT_THINK[1], min_length=1)
    require_reasoning: bool = False
    malformed_think: Literal["reject", "keep"] = "reject"
    # finish_reason=length: reject (default), or keep the cut answer (prepare then supervises
    # it without a stop token and marks the row truncated)
    keep_truncated: bool = False
    # run control
    resume: bool = False
    overwrite: bool = Field(False, validate_default=True)
    flush_every: int = Field(64, ge=1)
    flush_interval_s: float = Field(5.0, gt=0)
    progress_interval_s: float = Field(30.0, gt=0)

    @field_validator("fields")
    @classmethod
    def _known_field_kinds(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(v) - set(DEFAULT_FIELDS))
        if unknown:
            raise ValueError(f"unknown field kind(s) {unknown}; known: {sorted(DEFAULT_FIELDS)}")
        return v

    @field_validator("endpoint")
    @classmethod
    def _http_endpoints(cls, v: list[str], info: ValidationInfo) -> list[str]:
        for url in v:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL")
        if info.data.get("backend") == "openai" and not v:
            raise ValueError("--backend openai needs at least one --endpoint URL")
        return v

    @field_validator("overwrite")
    @classmethod
    def _not_both(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("resume"):
            raise ValueError("--resume and --overwrite exclude each other; pass one")
        return v

    def field_map(self) -> dict[str, str]:
        """The input column of each field kind: defaults overridden by ``fields``."""
        return {**DEFAULT_FIELDS, **self.fields}

    def sampling(self) -> dict[str, Any]:
        """The sampling parameters recorded with (and hashed into the id of) each sample."""
        out: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p,
                               "max_tokens": self.max_tokens}
        if self.seed is not None:
            out["seed"] = self.seed
        return out
