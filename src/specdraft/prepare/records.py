"""Reading conversations: ``RUN/generate/samples.jsonl`` (docs/run-dir.md) or a ``--data`` file,
both through the one reader of conversation files (:mod:`specdraft.artifacts.prompts`: every
container and row shape, the same rules and reject reasons as ``generate``).

A record's assistant messages are the supervised turns; its ``turns`` list (generate's
metadata: ``message_index``, ``finish_reason``, ``completion_token_ids``) says which when given.
A record without an assistant answer (a prompt-only shape: MT-bench ``turns``, ``question``,
``prompt``, Alpaca without ``output``) is rejected as ``no_answer``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

from specdraft.artifacts.prompts import (DEFAULT_FIELDS, RowRejected, iter_rows,
                                         read_conversation, row_id)
from specdraft.core.errors import clip
from specdraft.core.reasoning import split_inline
from specdraft.prepare.turns import TurnRejected


@dataclass(frozen=True)
class Sample:
    """One conversation; ``turns`` are ``{"message_index", "finish_reason",
    "completion_token_ids"}`` for each generated assistant message, in order."""

    id: str
    messages: list[dict[str, Any]]
    turns: list[dict[str, Any]]
    tools: list | None
    kwargs: dict[str, Any]


def iter_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, record)`` with ``where`` = ``file:line`` (or ``file[row N]``,
    ``file[item N]``): :func:`specdraft.artifacts.prompts.iter_rows` (``.jsonl[.gz|.zst]``,
    ``.json``, ``.parquet``, ``save_to_disk`` directories). Raises :class:`InputError` naming
    the file otherwise."""
    yield from iter_rows(path, flag="--data")


def record_id(record: dict[str, Any], where: str, fields: dict[str, str] | None = None) -> str:
    """The id a record's rejects are filed under: its given id, else ``where``."""
    return row_id(record, fields or DEFAULT_FIELDS, where)


def to_sample(record: dict[str, Any], where: str, default_kwargs: dict[str, Any],
              fields: dict[str, str] | None = None) -> Sample:
    """Normalize a record (:func:`~specdraft.artifacts.prompts.read_conversation`); raises
    :class:`TurnRejected` with the reader's reason (``bad_record``, ``bad_text``, ...) or
    ``no_answer``, naming what is wrong."""
    try:
        conv = read_conversation(record, where, fields={**DEFAULT_FIELDS, **(fields or {})})
    except RowRejected as err:
        raise TurnRejected(err.reason, str(err)) from None
    messages = conv.messages
    turns = conv.turns
    if turns is None:
        turns = [{"message_index": i, "finish_reason": m.get("finish_reason") or "stop",
                  "completion_token_ids": m.get("completion_token_ids")}
                 for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        raise TurnRejected("no_answer", f"{where}: no assistant answer to supervise (a "
                                        f"{conv.shape} row; run generate on it first)")
    _check_turns(messages, turns, where)
    kwargs = conv.chat_template_kwargs
    return Sample(id=conv.given_id or where, messages=messages, turns=list(turns),
                  tools=conv.tools, kwargs=dict(default_kwargs if kwargs is None else kwargs))


def split_inline_reasoning(sample: Sample, tags: tuple[str, str]) -> Sample:
    """``sample`` with think blocks inline in assistant ``content`` moved to ``reasoning``, as
    ``generate`` stores them (:func:`specdraft.core.reasoning.split_inline`, same rules).

    Messages that already carry a reasoning field are kept as they are. A malformed block (two
    closers, an opener without closer, ...) raises ``malformed_think`` naming the message.
    """
    messages = []
    for i, m in enumerate(sample.messages):
        content = m.get("content")
        if (m.get("role") != "assistant" or not isinstance(content, str)
                or any(isinstance(m.get(k), str) and m[k].strip()
                       for k in ("reasoning", "reasoning_content", "thinking"))
                or not (tags[0] in content or tags[1] in content)):
            messages.append(m)
            continue
        split = split_inline(content, open_tag=tags[0], close_tag=tags[1])
        if split.problem:
            raise TurnRejected("malformed_think", f"message {i}: {split.problem}")
        messages.append({**m, "content": split.content, "reasoning": split.reasoning})
    return replace(sample, messages=messages)


def _check_turns(messages: list[dict[str, Any]], turns: list[dict[str, Any]], where: str) -> None:
    for t in turns:
        i = t.get("message_index")
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(messages):
            raise TurnRejected("bad_record", f"{where}: turn message_index {clip(i)} out of range")
        if messages[i].get("role") != "assistant":
            raise TurnRejected("bad_record", f"{where}: message {i} is not an assistant message")


def iter_turns(sample: Sample, which: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(turn_index, turn)`` for the supervised turns: all, or only the last (``which``)."""
    indexed = list(enumerate(sample.turns))
    yield from (indexed[-1:] if which == "last" else indexed)
