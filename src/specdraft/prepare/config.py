"""Settings of ``specdraft prepare`` (field names = CLI flags with ``_``)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator

from specdraft.core.config import StageConfig, parse_json_object


def _split_tokens(value: Any) -> Any:
    """``"<think>,</think>"`` -> ``("<think>", "</think>")``; lists pass through."""
    if isinstance(value, str):
        return tuple(t.strip() for t in value.split(",") if t.strip())
    return value


class PrepareConfig(StageConfig):
    """Settings of the prepare stage: the tokenizer and chat template, which turns are
    supervised, think and stop tokens, and the sequence length limit.

    - ``verifier``: HF model directory, ``.gguf`` file or ``"smollm2"``; its tokenizer and chat
      template are used, and its vocabulary size is recorded for ``specdraft vocab``.
    - ``tokenizer``: a tokenizer directory or ``.gguf`` to use instead of the verifier's (same
      vocabulary assumed).
    - ``data``: a conversation file (``.jsonl``/``.json``/``.parquet``) or a ``save_to_disk``
      directory, read instead of ``RUN/generate/samples.jsonl``.
    - ``turns``: ``all`` supervises every generated assistant turn (one row each); ``last`` only
      the last one.
    - ``chat_template``: a file whose text replaces the tokenizer's chat template.
    - ``chat_template_kwargs``: kwargs for records that carry none (records from ``generate``
      carry the kwargs used at generation, and those win).
    - ``think_tokens``: ``(opener, closer)``; each must be one token of the vocabulary. None:
      ``<think>``/``</think>`` when the tokenizer has them as single tokens, else none.
    - ``stop_tokens``: the token(s) the model emits to end its turn. None: detected from the
      template (the first special token after the assistant's text), else the eos token.
    - ``reasoning_format``: how reasoning and the closer are joined when the generation prompt
      already ends with the think opener and the template drops the reasoning of the rendered
      turn (DeepSeek-R1 style): ``{reasoning}``, ``{close}`` are substituted, then the answer
      follows.
    - ``add_special_tokens``: tokenize the rendered text with the tokenizer's automatic special
      tokens (off: the template writes BOS itself, as vLLM/SGLang chat endpoints tokenize).
    """

    run_dir: str
    verifier: str = "smollm2"
    tokenizer: str | None = None
    data: str | None = None
    turns: Literal["all", "last"] = "all"
    max_seq_len: int = Field(2048, ge=2)
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    think_tokens: tuple[str, str] | None = None
    stop_tokens: tuple[str, ...] | None = None
    reasoning_format: str = "{reasoning}\n{close}\n\n"
    require_reasoning: bool = False
    add_special_tokens: bool = False
    trust_remote_code: bool = False
    resume: bool = False
    overwrite: bool = False

    @field_validator("think_tokens", "stop_tokens", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return _split_tokens(value)

    @field_validator("chat_template_kwargs", mode="before")
    @classmethod
    def _parse_kwargs(cls, value: Any) -> Any:
        return parse_json_object(value) or {}

    @field_validator("stop_tokens")
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if value is not None and len(value) == 0:
            raise ValueError("give at least one token, e.g. '<|im_end|>'")
        return value

    @field_validator("reasoning_format")
    @classmethod
    def _format_has_fields(cls, value: str) -> str:
        if "{reasoning}" not in value or "{close}" not in value:
            raise ValueError("must contain {reasoning} and {close}")
        return value
