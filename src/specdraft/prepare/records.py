"""Reading conversations: ``RUN/generate/samples.jsonl`` (docs/run-dir.md) or a ``--data`` file.

``--data`` accepts, per record, OpenAI ``messages`` (``role`` among system, developer, user,
assistant, tool; ``content`` a string, null or a list of text parts, joined with ``"\\n"``;
optional ``reasoning``/``reasoning_content``/``thinking`` and ``tool_calls``) or ShareGPT
``conversations`` (``from``/``value``), plus optional ``id``, ``tools`` (list or JSON string) and
``chat_template_kwargs``. Without a ``turns`` list every assistant message is a generated turn.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

from specdraft.core.chat import SHAREGPT_ROLES, content_text
from specdraft.core.errors import InputError, clip
from specdraft.core.jsonl import iter_jsonl, parse_json, read_json
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
    """Yield ``(where, record)`` with ``where`` = ``file:line`` (or ``file[row]``).

    ``.jsonl``: line by line; ``.json``: a list of records; ``.parquet`` or a ``save_to_disk``
    directory: through ``datasets``. Raises :class:`InputError` naming the file otherwise.
    """
    path = Path(path)
    if path.is_dir() or path.suffix == ".parquet":
        yield from _iter_dataset(path)
    elif path.suffix == ".json":
        data = read_json(path, what="--data file")
        if not isinstance(data, list):
            raise InputError(f"{path}: expected a JSON list of conversations")
        for i, r in enumerate(data):
            if not isinstance(r, dict):
                raise InputError(f"{path}[{i}]: expected a JSON object, got {type(r).__name__}")
            yield f"{path}[{i}]", r
    elif path.exists():
        yield from ((f"{path}:{n}", r) for n, r in iter_jsonl(path))
    else:
        raise InputError(f"--data {path}: file not found")


def _iter_dataset(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    import datasets

    try:
        ds = (datasets.load_from_disk(str(path)) if path.is_dir()
              else datasets.Dataset.from_parquet(str(path)))
    except Exception as err:  # datasets/pyarrow raise many types for a bad file or directory
        raise InputError(f"--data {path}: not a readable dataset ({type(err).__name__}: "
                         f"{clip(str(err), 200)})") from None
    if isinstance(ds, datasets.DatasetDict):
        raise InputError(f"--data {path}: a DatasetDict; point at one split's directory")
    for i, record in enumerate(ds):
        yield f"{path}[{i}]", record


def to_sample(record: dict[str, Any], where: str, default_kwargs: dict[str, Any]) -> Sample:
    """Normalize a record; raises :class:`TurnRejected` (``bad_record``) naming what is wrong."""
    sample_id = _sample_id(record, where)
    if isinstance(record.get("messages"), list):
        messages = [_message(m, i, where) for i, m in enumerate(record["messages"])]
    elif isinstance(record.get("conversations"), list):
        messages = [_from_sharegpt(_message(m, i, where, sharegpt=True), where)
                    for i, m in enumerate(record["conversations"])]
    else:
        raise TurnRejected("bad_record", f"{where}: no 'messages' or 'conversations' list")
    turns = record.get("turns")
    if turns is not None and not (isinstance(turns, list)
                                  and all(isinstance(t, dict) for t in turns)):
        raise TurnRejected("bad_record", f"{where}: 'turns' must be a list of objects")
    if turns is None:
        turns = [{"message_index": i, "finish_reason": m.get("finish_reason") or "stop",
                  "completion_token_ids": m.get("completion_token_ids")}
                 for i, m in enumerate(messages) if m.get("role") == "assistant"]
    _check_turns(messages, turns, where)
    kwargs = record.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TurnRejected("bad_record", f"{where}: 'chat_template_kwargs' must be an object, "
                           f"got {type(kwargs).__name__}")
    return Sample(id=sample_id, messages=messages, turns=list(turns),
                  tools=_tools(record.get("tools"), where),
                  kwargs=dict(default_kwargs if kwargs is None else kwargs))


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def _sample_id(record: dict[str, Any], where: str) -> str:
    sample_id = record.get("id")
    if sample_id in (None, ""):
        return where
    if not isinstance(sample_id, (str, int)) or isinstance(sample_id, bool):
        raise TurnRejected("bad_record", f"{where}: 'id' must be a string or an integer, got "
                           f"{type(sample_id).__name__}")
    return str(sample_id)


def _message(m: Any, i: int, where: str, *, sharegpt: bool = False) -> dict[str, Any]:
    """A copy of message ``i``, checked: an object with a known string role and a string or null
    text (OpenAI content parts are joined into one string, :func:`content_text`); raises
    ``bad_record`` naming what is wrong."""
    if not isinstance(m, dict):
        raise TurnRejected("bad_record", f"{where}: message {i} is a {type(m).__name__}, "
                           f"not an object")
    role_key, text_key = ("from", "value") if sharegpt else ("role", "content")
    role = m.get(role_key)
    if not isinstance(role, str):
        raise TurnRejected("bad_record", f"{where}: message {i} {role_key!r} must be a string, "
                           f"got {type(role).__name__}")
    if not sharegpt and role not in _ROLES:
        raise TurnRejected("bad_record", f"{where}: message {i} has unknown role {clip(role)} "
                           f"(expected one of {sorted(_ROLES)})")
    text = m.get(text_key)
    if sharegpt and text is not None and not isinstance(text, str):
        raise TurnRejected("bad_record", f"{where}: message {i} {text_key!r} must be a string, "
                           f"got {type(text).__name__}")
    try:
        return {**m, text_key: content_text(text)} if text_key in m else dict(m)
    except ValueError as err:
        raise TurnRejected("bad_record", f"{where}: message {i} {text_key!r} {err}") from None


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
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str):
            raise TurnRejected("bad_record", f"{where}: message {i} has no role")


def _tools(tools: Any, where: str) -> list | None:
    if tools in (None, "", []):
        return None
    if isinstance(tools, str):
        try:
            tools = parse_json(tools)
        except ValueError:
            raise TurnRejected("bad_record", f"{where}: 'tools' is not valid JSON") from None
    if not isinstance(tools, list):
        raise TurnRejected("bad_record", f"{where}: 'tools' must be a list")
    return tools


def _from_sharegpt(message: dict[str, Any], where: str) -> dict[str, Any]:
    """A ShareGPT ``{"from", "value"}`` message as an OpenAI message (``function_call`` values,
    JSON ``{"name", "arguments"}``, become an assistant ``tool_calls`` entry)."""
    role = SHAREGPT_ROLES.get(str(message.get("from", "")).lower())
    if role is None:
        raise TurnRejected("bad_record",
                           f"{where}: unknown ShareGPT role {clip(message.get('from'))}")
    out = {k: v for k, v in message.items() if k not in ("from", "value")}
    out.update(role=role, content=message.get("value"))
    if message.get("from") == "function_call":
        try:
            call = parse_json(message.get("value") or "")
        except ValueError:
            raise TurnRejected("bad_record", f"{where}: function_call value is not JSON") from None
        if not isinstance(call, dict):
            raise TurnRejected("bad_record", f"{where}: function_call value is not a JSON object")
        out.update(content="", tool_calls=[{"type": "function", "function": call}])
    return out


def iter_turns(sample: Sample, which: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(turn_index, turn)`` for the supervised turns: all, or only the last (``which``)."""
    indexed = list(enumerate(sample.turns))
    yield from (indexed[-1:] if which == "last" else indexed)
