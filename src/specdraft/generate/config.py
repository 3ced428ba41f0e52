"""Settings of ``specdraft generate`` (field names = CLI flag names with ``_``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from specdraft.artifacts.prompts import DEFAULT_FIELDS, FIELD_HELP, check_field_kinds
from specdraft.core.chat import DEFAULT_THINK
from specdraft.core.config import StageConfig, check_http_urls

class GenerateConfig(StageConfig):
    """Settings of the generate stage: the prompt file, the backend (the verifier in-process, or
    OpenAI-compatible servers), sampling, chat-template arguments and reasoning checks.

    ``backend="local"`` runs the verifier in-process (``verifier``, ``device``, ``dtype``,
    ``batch_size``); ``backend="openai"`` sends ``/v1/chat/completions`` requests to
    ``endpoint`` (one or more base URLs) with at most ``concurrency`` in flight.
    """

    prompts: str = Field(description="Prompt file (.jsonl, .jsonl.gz, .jsonl.zst, .json, "
                         ".parquet) or save_to_disk dir, rows of any shape of --field: the "
                         "system and user turns are kept, answers regenerated; with tool "
                         "calling, tools sent and the data's tool calls that a result follows "
                         "kept (docs/stages.md); or builtin:NAME.")
    run_dir: str = Field(description="Run directory; writes RUN/generate/.")
    backend: Literal["openai", "local"] = Field(
        "local", description="local: the verifier in-process; openai: OpenAI-compatible "
                             "servers at --endpoint.")
    # openai backend
    endpoint: list[str] = Field(default_factory=list, validate_default=True,
                                description="openai: server base URL(s); repeat or comma-"
                                            "separate to spread the load.")
    model: str | None = Field(None, description="openai: model name (none: the server's first).")
    api_key_env: str | None = Field(None, description="openai: environment variable holding "
                                                      "the API key.")
    concurrency: int = Field(64, ge=1, description="openai: requests in flight.")
    timeout_s: float = Field(600.0, gt=0, description="openai: seconds per request.")
    max_retries: int = Field(5, ge=0, description="openai: retries per request (HTTP 429/5xx, "
                                                  "timeouts, dropped connections, bad bodies).")
    backoff_base_s: float = Field(1.0, ge=0, description="openai: retry n waits d/2..d "
                                                         "seconds, d = this * 2**n (capped by "
                                                         "--backoff-max-s).")
    backoff_max_s: float = Field(60.0, ge=0, description="openai: longest retry delay in "
                                                         "seconds (also caps Retry-After).")
    return_token_ids: bool = Field(True, description="openai: ask for vLLM's prompt and "
                                                     "completion token ids (off for strict "
                                                     "servers).")
    extra_body: dict[str, Any] = Field(default_factory=dict,
                                       description="openai: JSON object merged into each "
                                                   "request, e.g. '{\"top_k\": 20}'.")
    # local backend
    verifier: str = Field("smollm2", description="local: HF model dir, .gguf file or smollm2 "
                                                 "(the embedded SmolLM2-135M).")
    device: str = Field("cpu", description="local: cpu, cuda, cuda:1, ...")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="local: the verifier's weights dtype.")
    batch_size: int = Field(8, ge=1, description="local: prompts per batch.")
    # sampling and chat template
    max_tokens: int = Field(2048, ge=1, description="Completion tokens per turn.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling: smallest token set "
                                                      "with this probability mass.")
    seed: int | None = Field(None, description="Sampling seed (none: unseeded).")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="JSON object for the chat template, e.g. "
                                          "'{\"enable_thinking\": true}'; stored with each "
                                          "sample.")
    system_prompt: str | None = Field(None, description="System message for rows without one.")
    # inputs
    fields: dict[str, str] = Field(default_factory=dict, description=FIELD_HELP)
    limit: int | None = Field(None, ge=1, description="Use the first N prompts only.")
    max_reject_fraction: float = Field(
        0.5, ge=0, le=1, description="Stop before generating when more than this fraction of "
                                     "the input rows is rejected as bad (a reader reason, a "
                                     "reused id, too_long; not repeated rows): the input is "
                                     "mostly wrong.")
    # reasoning
    think_tokens: tuple[str, str] | None = Field(
        None, description="OPENER,CLOSER of reasoning: inline in answers, and the local "
                          "backend's chat format (none: <think>,</think>).")
    require_reasoning: bool = Field(False, description="Reject turns without reasoning "
                                                       "(empty_reasoning).")
    malformed_think: Literal["reject", "keep"] = Field(
        "reject", description="Turns with broken think tags: reject them, or keep them flagged.")
    keep_truncated: bool = Field(False, description="Keep answers cut by --max-tokens (prepare "
                                                    "supervises them without a stop token) "
                                                    "instead of rejecting them.")
    # run control
    resume: bool = Field(False, description="Continue a partial run: skip finished ids, retry "
                                            "ids rejected with error.")
    overwrite: bool = Field(False, validate_default=True,
                            description="Delete RUN/generate and start over.")
    flush_every: int = Field(64, ge=1, description="Samples per fsynced write batch.")
    flush_interval_s: float = Field(5.0, gt=0, description="Seconds after which pending "
                                                           "samples are written anyway.")
    progress_interval_s: float = Field(30.0, gt=0, description="Seconds between progress "
                                                               "lines.")
    # the chat format of local generation (a server renders with its own)
    chat_template: str | None = Field(None, description="Local backend: template file "
                                                        "replacing the tokenizer's.")
    stop_tokens: tuple[str, ...] | None = Field(None, description="Local backend: end-of-turn "
                                                                  "token(s) (default: detected "
                                                                  "from the template).")

    @model_validator(mode="before")
    @classmethod
    def _one_think_setting(cls, data: Any) -> Any:
        """Settings files written before think markers were one setting: :func:`fold_think_pair`."""
        return fold_think_pair(data) if isinstance(data, dict) else data

    @field_validator("stop_tokens", "think_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, v: Any) -> Any:
        return tuple(t.strip() for t in v.split(",") if t.strip()) if isinstance(v, str) else v

    @property
    def think(self) -> tuple[str, str]:
        """The reasoning markers in effect: ``think_tokens`` or ``<think>``/``</think>``."""
        return tuple(self.think_tokens) if self.think_tokens else DEFAULT_THINK

    @field_validator("fields")
    @classmethod
    def _known_field_kinds(cls, v: dict[str, str]) -> dict[str, str]:
        return check_field_kinds(v)

    @field_validator("endpoint")
    @classmethod
    def _http_endpoints(cls, v: list[str], info: ValidationInfo) -> list[str]:
        check_http_urls(v)
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


LEGACY_THINK = ("think_open", "think_close")


def fold_think_pair(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` (generate's, as a dict) with the ``think_open``/``think_close`` pair of
    settings files written before think markers were one setting folded into ``think_tokens``
    (``[OPENER, CLOSER]``); ``settings`` itself when it has neither. Used by generate's config
    and by ``specdraft run``'s ``[generate]`` section. Raises ValueError for one of the pair
    alone, or the pair beside ``think_tokens``."""
    if not set(LEGACY_THINK) & set(settings):
        return settings
    data = dict(settings)
    pair = (data.pop("think_open", None), data.pop("think_close", None))
    if None in pair or data.get("think_tokens") is not None:
        raise ValueError("think_open/think_close: give both, or think_tokens: "
                         "[OPENER, CLOSER] alone (one setting)")
    return {**data, "think_tokens": list(pair)}
