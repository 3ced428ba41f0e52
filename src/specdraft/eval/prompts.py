"""Eval prompt files: JSONL with ``question`` (GSM8K), ``turns`` (MT-bench; first turn),
``prompt`` (plain text) or ``messages`` (a chat; messages up to the last user turn)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdraft.core.assets import resolve_path
from specdraft.core.errors import InputError
from specdraft.core.jsonl import iter_jsonl


def record_messages(record: dict[str, Any], where: str) -> list[dict[str, str]]:
    """Chat messages of one record; raises :class:`InputError` naming ``where`` (file:line)."""
    if isinstance(record.get("messages"), list) and record["messages"]:
        msgs = list(record["messages"])
        last_user = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=-1)
        if last_user < 0:
            raise InputError(f"{where}: messages have no user turn")
        return [{"role": m["role"], "content": m.get("content") or ""}
                for m in msgs[: last_user + 1]]
    for key in ("question", "prompt"):
        if isinstance(record.get(key), str) and record[key].strip():
            return [{"role": "user", "content": record[key]}]
    turns = record.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return [{"role": "user", "content": turns[0]}]
    raise InputError(f"{where}: no prompt field (expected question, turns, prompt or messages)")


def load_prompts(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """``[{"id", "messages"}]`` for the first ``limit`` records of ``path``."""
    out = []
    path = resolve_path(path)
    for lineno, record in iter_jsonl(path):
        if limit is not None and len(out) >= limit:
            break
        pid = record.get("id", record.get("question_id", f"line{lineno}"))
        out.append({"id": str(pid), "messages": record_messages(record, f"{path}:{lineno}")})
    if not out:
        raise InputError(f"{path}: no prompts")
    return out


def render(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the chat rendered with the verifier's template (generation prompt added)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
