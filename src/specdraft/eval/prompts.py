"""Eval prompts: any prompt file that ``specdraft generate`` reads (JSONL / JSON / Parquet with
``question``, ``turns``, ``prompt``, ``messages`` or ``conversations``; parsed by
:func:`specdraft.artifacts.prompts.parse_row`), evaluated on its first user turn (MT-bench: turn 1)
with the row's system prompt."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from specdraft.artifacts.verifier_contract import run_verifier
from specdraft.core.chat import ChatFormat
from specdraft.core.errors import InputError
from specdraft.artifacts.prompts import DEFAULT_FIELDS, iter_rows, parse_row


def load_prompts(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """``[{"id", "messages"}]`` for the first ``limit`` rows of ``path`` (``builtin:NAME`` works).

    Raises :class:`InputError` naming the file and line of a bad row, or when there is none.
    """
    out = []
    for where, row in itertools.islice(iter_rows(path), limit):
        p = parse_row(row, where, fields=DEFAULT_FIELDS, sampling={}, chat_template_kwargs={})
        system = [{"role": "system", "content": p.system}] if p.system is not None else []
        out.append({"id": p.id, "messages": system + [{"role": "user", "content": p.turns[0]}]})
    if not out:
        raise InputError(f"{path}: no prompts")
    return out


def eval_chat_format(config: Any, tokenizer: Any) -> ChatFormat:
    """The chat format eval renders with: the run's (``RUN/verifier.json``'s,
    :func:`specdraft.artifacts.verifier_contract.run_verifier`, so τ is
    measured on prompts formatted like the training data), else resolved from the verifier's
    tokenizer; ``--chat-template`` / ``--chat-template-kwargs`` override either."""
    fmt = run_verifier(config.run_dir).chat
    if fmt is None or config.chat_template is not None:
        kwargs = fmt.kwargs if fmt is not None else {}
        fmt = ChatFormat.resolve(tokenizer, chat_template=config.chat_template, kwargs=kwargs)
    if config.chat_template_kwargs is not None:
        fmt = fmt.model_copy(update={"kwargs": dict(config.chat_template_kwargs)})
    return fmt


def render(tokenizer: Any, messages: list[dict[str, str]], fmt: ChatFormat) -> list[int]:
    """Token ids ``[T]`` of the chat's generation prompt, rendered with ``fmt``."""
    return fmt.prompt_ids(tokenizer, messages)
