"""Separate a chat completion's reasoning from its answer.

Order (first that is non-empty wins): ``message.reasoning`` (vLLM since PR #27752),
``message.reasoning_content`` (older vLLM, SGLang, llama.cpp, DeepSeek API), else the think block
inline in ``content``. The inline split also covers chat templates that put the opener in the
prompt (DeepSeek-R1, Qwen3 thinking), where the completion holds only the closer.
Malformed blocks (two closers, an opener with no closer, ...) are reported in ``problem``, never
silently kept or dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdraft.core.chat import DEFAULT_THINK, SERVER_REASONING_FIELDS


@dataclass(frozen=True)
class Split:
    """An assistant turn split into ``content`` (the answer) and ``reasoning`` (or None).

    ``source`` is ``"reasoning"``, ``"reasoning_content"``, ``"inline"`` or ``"none"``;
    ``problem`` describes a malformed think block (None when well formed).
    """

    content: str
    reasoning: str | None
    source: str
    problem: str | None = None


def _nonempty(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def split_inline(text: str, *, open_tag: str = DEFAULT_THINK[0],
                 close_tag: str = DEFAULT_THINK[1]) -> Split:
    """Split ``open_tag … close_tag`` out of ``text``.

    - no tags: all of ``text`` is the answer, source ``"none"``;
    - ``[open] R close A``: reasoning ``R``, answer ``A`` (both stripped), source ``"inline"``
      (the opener may be absent: it was the end of the prompt);
    - more than one closer or opener, an opener with no closer, or text before the opener:
      ``problem`` is set; reasoning/answer are split at the first closer (or, with no closer,
      everything after the opener is reasoning and the answer is empty).
    """
    n_open, n_close = text.count(open_tag), text.count(close_tag)
    if n_open == 0 and n_close == 0:
        return Split(content=text.strip(), reasoning=None, source="none")
    problem = _problem(text, n_open, n_close, open_tag, close_tag)
    if n_close == 0:
        reasoning = text.split(open_tag, 1)[1]
        return Split(content="", reasoning=reasoning.strip(), source="inline", problem=problem)
    head, answer = text.split(close_tag, 1)
    reasoning = head.split(open_tag, 1)[1] if open_tag in head else head
    return Split(content=answer.strip(), reasoning=reasoning.strip(), source="inline",
                 problem=problem)


def _problem(text: str, n_open: int, n_close: int, open_tag: str, close_tag: str) -> str | None:
    if n_close > 1:
        return f"{n_close} {close_tag} closers"
    if n_open > 1:
        return f"{n_open} {open_tag} openers"
    if n_open == 1 and n_close == 0:
        return f"{open_tag} opener without {close_tag}"
    if n_open == 1 and text.index(close_tag) < text.index(open_tag):
        return f"{close_tag} before {open_tag}"
    if n_open == 1 and text.split(open_tag, 1)[0].strip():
        return f"text before {open_tag}"
    return None


def extract(message: dict[str, Any], *, open_tag: str = DEFAULT_THINK[0],
            close_tag: str = DEFAULT_THINK[1]) -> Split:
    """Reasoning and answer of an OpenAI chat ``message`` (``choices[0].message``).

    When ``reasoning`` and ``reasoning_content`` hold the same text it is kept once; when they
    differ, ``reasoning`` wins and ``problem`` says so. Think tags left in ``content`` next to a
    separate reasoning field are reported as a problem too.
    """
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = str(content)
    first, second = SERVER_REASONING_FIELDS
    for key in SERVER_REASONING_FIELDS:
        text = _nonempty(message.get(key))
        if text is None:
            continue
        problem = None
        other = _nonempty(message.get(second)) if key == first else None
        if other is not None and other.strip() != text.strip():
            problem = f"{first} and {second} differ; kept {first}"
        if close_tag in content:
            problem = f"{close_tag} in content although the server parsed reasoning"
        return Split(content=content.strip(), reasoning=text.strip(), source=key,
                     problem=problem)
    return split_inline(content, open_tag=open_tag, close_tag=close_tag)
