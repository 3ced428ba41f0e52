"""Settings of ``specdraft prepare`` (field names = CLI flags with ``_``)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator

from specdraft.artifacts.prompts import DEFAULT_FIELDS, FIELD_HELP, check_field_kinds
from specdraft.core.config import StageConfig, parse_json_object


def _split_tokens(value: Any) -> Any:
    """``"<think>,</think>"`` -> ``("<think>", "</think>")``; lists pass through."""
    if isinstance(value, str):
        return tuple(t.strip() for t in value.split(",") if t.strip())
    return value


class PrepareConfig(StageConfig):
    """Settings of the prepare stage: the tokenizer and chat template, which turns are
    supervised, think and stop tokens, and the sequence length limit (each field's
    ``description`` says what it does; ``specdraft prepare --help`` shows them).
    """

    run_dir: str = Field(description="Run directory; reads RUN/generate/, writes RUN/prepare/.")
    verifier: str = Field("smollm2", description="HF model dir, .gguf file or smollm2: its "
                                                 "tokenizer and chat template are used, its "
                                                 "vocabulary size recorded for vocab.")
    tokenizer: str | None = Field(None, description="Tokenizer dir or .gguf instead of the "
                                                    "verifier's (same vocabulary assumed).")
    data: str | None = Field(None, description="Conversation file (.jsonl, .jsonl.gz, "
                                               ".jsonl.zst, .json, .parquet) or save_to_disk "
                                               "dir, rows of any shape of --field with their "
                                               "answers (rows without one: no_answer), read "
                                               "instead of RUN/generate/samples.jsonl.")
    fields: dict[str, str] = Field(default_factory=dict, description=FIELD_HELP)
    max_reject_fraction: float = Field(
        0.5, ge=0, le=1, description="Stop (no dataset written) when more than this fraction "
                                     "of the input turns (and records rejected whole) is "
                                     "rejected as bad input (a reader reason, duplicate_id, "
                                     "no_answer; not too_long or no_reasoning, which flags "
                                     "choose).")
    turns: Literal["all", "last"] = Field("all", description="all: every generated assistant "
                                                             "turn is supervised (one row "
                                                             "each); last: only the last one.")
    max_seq_len: int = Field(2048, ge=2, description="Tokens per row; longer turns are "
                                                     "rejected (too_long).")
    chat_template: str | None = Field(None, description="File whose text replaces the "
                                                        "tokenizer's chat template.")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="JSON object for records that carry none (records "
                                          "from generate carry theirs, and those win), e.g. "
                                          "'{\"enable_thinking\": false}'.")
    think_tokens: tuple[str, str] | None = Field(
        None, description="OPEN,CLOSE reasoning tokens, each one token of the vocabulary (none: "
                          "<think>,</think> when the tokenizer has them as single tokens).")
    stop_tokens: tuple[str, ...] | None = Field(
        None, description="The token(s) that end the model's turn, comma-separated (none: the "
                          "first special token after the assistant's text in the template, "
                          "else eos).")
    reasoning_format: str = Field(
        "{reasoning}\n{close}\n\n",
        description="How reasoning and the closer are joined when the generation prompt ends "
                    "with the think opener and the template drops the turn's reasoning "
                    "(DeepSeek-R1 style); {reasoning} and {close} are substituted.")
    require_reasoning: bool = Field(False, description="Reject turns without reasoning "
                                                       "(no_reasoning).")
    allow_empty_think_scaffold: bool = Field(
        False, description="Supervise the empty think block a thinking template writes before "
                           "an answer without reasoning (<think>\\n\\n</think>\\n\\n) as "
                           "if the model generated it; off: such turns are rejected as "
                           "empty_think_scaffold, since without the server's token ids "
                           "nobody knows the model wrote it.")
    add_special_tokens: bool = Field(False, description="Let the tokenizer add its automatic "
                                                        "special tokens (off: the template "
                                                        "writes BOS itself, as vLLM/SGLang "
                                                        "chat endpoints tokenize).")
    trust_remote_code: bool = Field(False, description="Allow the tokenizer's own code.")
    resume: bool = Field(False, description="Run again over RUN/prepare (prepare is "
                                            "deterministic).")
    overwrite: bool = Field(False, description="Delete RUN/prepare and start over.")

    @field_validator("fields")
    @classmethod
    def _known_field_kinds(cls, v: dict[str, str]) -> dict[str, str]:
        return check_field_kinds(v)

    def field_map(self) -> dict[str, str]:
        """The input column of each field kind: defaults overridden by ``fields``."""
        return {**DEFAULT_FIELDS, **self.fields}

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
