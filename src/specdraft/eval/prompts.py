"""Eval prompts: any prompt file that ``specdraft generate`` reads (JSONL / JSON / Parquet with
``question``, ``turns``, ``prompt``, ``messages`` or ``conversations``; parsed by
:func:`specdraft.generate.inputs.parse_row`), evaluated on its first user turn (MT-bench: turn 1)
with the row's system prompt."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from specdraft.core.errors import InputError
from specdraft.generate.config import DEFAULT_FIELDS
from specdraft.generate.inputs import iter_rows, parse_row


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


def render(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the chat rendered with the verifier's template (generation prompt added)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
