"""Input screening before any prompt reaches the verifier: over-long prompts are rejected as
``too_long``, and a run whose input is mostly rejected stops with the counts.

A prompt's length is measured on its *lower-bound conversation*: the system message and every
user turn, each earlier turn answered with an empty assistant message, rendered with the
generation prompt. Real answers only add tokens, so a prompt whose lower bound does not fit the
verifier's context (``tokens >= context``: no room for one generated token) can never be
answered; its turns are never sent. Where the context comes from: the local backend, the
verifier's ``max_position_embeddings``; a server, ``max_model_len`` of ``GET /v1/models`` (vLLM,
SGLang), else the ``--verifier`` config when one is given. Token counts: the local tokenizer, or
the server's ``POST /tokenize`` (else the ``--verifier`` tokenizer).
"""

from __future__ import annotations

from typing import Any, Callable

from specdraft.artifacts.prompts import Prompt
from specdraft.core.chat import message_for_request


def lower_bound_messages(prompt: Prompt) -> list[dict[str, Any]]:
    """The conversation whose rendering is the shortest prompt of ``prompt``'s last turn (a
    tool-calling prompt: its script up to the last slot, earlier slots answered empty, the kept
    tool calls and results as they are; its ``tools`` go with it)."""
    messages: list[dict[str, Any]] = []
    if prompt.system is not None:
        messages.append({"role": "system", "content": prompt.system})
    if prompt.script is not None:
        last = len(prompt.script) - 1 - prompt.script[::-1].index(None)
        messages += [{"role": "assistant", "content": ""} if m is None
                     else message_for_request(m) for m in prompt.script[:last]]
        return messages
    for i, turn in enumerate(prompt.turns):
        if i:
            messages.append({"role": "assistant", "content": ""})
        messages.append({"role": "user", "content": turn})
    return messages


def too_long(tokens: int | None, context: int | None) -> str | None:
    """The ``too_long`` detail when ``tokens`` leave no room in ``context``, else None (also
    when either is unknown)."""
    if tokens is None or context is None or tokens < context:
        return None
    return (f"prompt has at least {tokens} tokens, the verifier's context is {context} "
            f"(no room for an answer); shorten the prompt or serve a longer context")


def screen_lengths(todo: list[Prompt], count: Callable[[Prompt], int | None],
                   context: int | None, reject: Callable[[Prompt, str], None]) -> list[Prompt]:
    """``todo`` without the prompts :func:`too_long` for ``context`` (each handed to
    ``reject(prompt, detail)``); ``count(prompt)`` measures one prompt (None: unknown)."""
    if context is None:
        return todo
    kept = []
    for p in todo:
        detail = too_long(count(p), context)
        if detail is None:
            kept.append(p)
        else:
            reject(p, detail)
    return kept
