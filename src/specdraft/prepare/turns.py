"""One supervised assistant turn -> ``input_ids`` and ``loss_mask``: the core invariant of
specdraft.

Invariant: every token with ``loss_mask == 1`` is a token the serving engine generated, after
exactly the prompt tokens it rendered. How a turn is encoded:

1. ``prompt = render(history, add_generation_prompt=True)`` with the sample's
   ``chat_template_kwargs`` and ``tools``; ``P = encode(prompt)``: what the server fed the model.
2. If the server returned ``completion_token_ids``, the sequence is ``P + ids`` verbatim.
3. Otherwise ``full = render(history + [turn])``. When ``full`` starts with ``prompt`` the
   completion is what follows. When it does not, the two renders must agree on the history
   (``render(history)`` is a prefix of both) and differ only by a known scaffold at the end of the
   generation prompt (longest common prefix):

   - an empty think block the template inserts (``enable_thinking=false``): the completion is the
     rendered turn after the common prefix (only for turns without reasoning);
   - a think opener ending the generation prompt (DeepSeek-R1 style) while the template drops the
     turn's reasoning: the completion is ``reasoning_format`` (reasoning + closer) + the answer.

   Anything else is rejected as ``template_mismatch``. When the server reported the prompt ids
   it fed the verifier, ``P`` must equal them, else the turn is rejected as ``prompt_mismatch``.
4. The whole text ``prompt + completion`` is tokenized ONCE (not piece by piece: BPE can merge
   across piece boundaries) and the completion is what follows ``P`` when the row starts with
   exactly ``P``; when a merge crosses the prompt's end, the prompt stays ``P`` (what the server
   fed) and the completion is tokenized on its own (see :func:`completion_ids`). The
   completion ends at the first stop token; template text after it (e.g. ``\\n``) is never
   generated, so it is dropped; it must be whitespace (else ``stop_token_in_content``).
5. A turn that calls tools (``tool_calls``) is rendered back through the template like any
   answer (the calls' ``arguments`` as objects, as the server hands them to the template). When
   the server returned its ``completion_token_ids``, those are the supervised tokens, as for any
   answer, and :func:`tool_call_rendering_differs` compares the template's rendering of the
   stored call with them: a difference (the model wrote its JSON with other spacing than the
   template's ``tojson``, say) is counted, not rejected. The ids are what the model generated
   after exactly the prompt the server reported, and a verifier's call is never the history of
   a later turn (generate ends the sample there), so the row stays true.
6. ``loss_mask`` is 0 on ``P``, 1 on the completion and the stop token. A turn cut by the
   server's ``max_tokens`` (``finish_reason == "length"``) has no stop token and is marked
   truncated; so is a completion cut at ``max_seq_len``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any

from specdraft.core.chat import Renderer, TemplateError, message_for_template


class TurnRejected(Exception):
    """A turn that cannot be encoded with a correct mask; ``reason`` is the rejects.jsonl key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Turn:
    """A supervised assistant turn of a sample.

    ``messages[message_index]`` is the assistant message; ``reasoning`` is its reasoning text
    (may be empty); ``finish_reason`` as the server reported it (``"stop"`` when unknown);
    ``prompt_token_ids`` the exact prompt the server fed the verifier, when it returned them.
    """

    messages: list[dict[str, Any]]
    message_index: int
    reasoning: str
    finish_reason: str
    completion_token_ids: list[int] | None
    tools: list | None
    kwargs: dict[str, Any]
    prompt_token_ids: list[int] | None = None


@dataclass(frozen=True)
class Encoded:
    """``input_ids`` [T] and ``loss_mask`` [T] (0/1) of one row, and how it was made.

    ``n_prompt``: length of the unsupervised prompt; ``scaffold``: how the completion was found
    (``None``, ``"empty_think_block"``, ``"think_opener"``, ``"empty_think_scaffold"``,
    ``"token_ids"``, with
    ``"+prompt_boundary"`` / ``"prompt_boundary"`` when tokenized apart from the prompt).
    """

    input_ids: list[int]
    loss_mask: list[int]
    n_prompt: int
    truncated: bool
    scaffold: str | None


@dataclass(frozen=True)
class Rules:
    """Per-run encoding settings: stop ids, think tokens (names), limits."""

    stop_ids: frozenset[int]
    think: tuple[str, str] | None
    max_seq_len: int
    reasoning_format: str


def encode_turn(renderer: Renderer, turn: Turn, rules: Rules) -> Encoded:
    """Encode ``turn`` (see the module docstring). Raises :class:`TurnRejected`."""
    history = [message_for_template(m) for m in turn.messages[:turn.message_index]]
    prompt = _render(renderer, history, turn, generation=True)
    prompt_ids = renderer.encode(prompt)
    check_server_prompt(prompt_ids, turn.prompt_token_ids)
    if len(prompt_ids) >= rules.max_seq_len:
        raise TurnRejected("too_long", f"prompt has {len(prompt_ids)} tokens >= --max-seq-len "
                                       f"{rules.max_seq_len}")
    if turn.completion_token_ids is not None:
        completion, scaffold = list(turn.completion_token_ids), "token_ids"
        cut = turn.finish_reason == "length"
    else:
        text, scaffold = completion_text(renderer, history, prompt, turn, rules)
        completion, split = completion_ids(renderer, prompt_ids, prompt, text)
        completion, cut = end_at_stop(renderer, completion, turn, rules)
        check_reasoning_kept(renderer, completion, turn)
        if split:
            scaffold = f"{scaffold}+prompt_boundary" if scaffold else "prompt_boundary"
    return _assemble(prompt_ids, completion, cut, scaffold, rules.max_seq_len)


def tool_call_rendering_differs(renderer: Renderer, turn: Turn, rules: Rules,
                                enc: Encoded) -> str | None:
    """For a turn whose message calls tools and that carries the server's
    ``completion_token_ids`` (``enc``, encoded from them): where the template's rendering of the
    stored message (content, reasoning and ``tool_calls``) differs from those ids (the first
    differing token and both texts), or None when it is exactly them. Turns without calls or
    without server ids give None (without ids the rendering is the completion). Raises
    :class:`TurnRejected` when the stored message cannot be rendered at all."""
    message = turn.messages[turn.message_index]
    if not message.get("tool_calls") or turn.completion_token_ids is None:
        return None
    rendered = encode_turn(renderer, replace(turn, completion_token_ids=None), rules)
    got, want = rendered.input_ids[rendered.n_prompt:], enc.input_ids[enc.n_prompt:]
    if got == want:
        return None
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return (f"the template renders the stored tool call as {renderer.decode(got[at:])[:120]!r} "
            f"where the server generated {renderer.decode(want[at:])[:120]!r} (token {at} of "
            f"the completion)")


def check_token_ids(ids: Any, what: str, vocab_size: int) -> list[int] | None:
    """``ids`` (a turn's ``completion_token_ids`` / ``prompt_token_ids``) as a list of ints, or
    None; raises ``bad_record`` unless it is a list of integers in ``[0, vocab_size)`` (an id
    out of range would index past the verifier's embedding in ``extract``)."""
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in ids):
        raise TurnRejected("bad_record", f"{what} must be a list of token ids in "
                           f"[0, {vocab_size})")
    return ids


def check_server_prompt(prompt_ids: list[int], server_ids: list[int] | None) -> None:
    """Reject (``prompt_mismatch``) a turn whose rendered prompt differs from the ids the server
    reported it fed the verifier (vLLM's ``prompt_token_ids``): its completion was generated
    after a prompt this row would not contain, so the row would teach the wrong context."""
    if server_ids is None or list(server_ids) == prompt_ids:
        return
    at = next((i for i, (a, b) in enumerate(zip(prompt_ids, server_ids)) if a != b),
              min(len(prompt_ids), len(server_ids)))
    raise TurnRejected("prompt_mismatch", f"rendered prompt ({len(prompt_ids)} tokens) differs "
                       f"from the server's prompt_token_ids ({len(server_ids)}) at token {at}")


def completion_ids(renderer: Renderer, prompt_ids: list[int], prompt: str,
                   text: str) -> tuple[list[int], bool]:
    """Token ids of the completion ``text`` generated after ``prompt`` (= ``prompt_ids``), and
    whether they had to be tokenized apart from the prompt.

    ``prompt + text`` is tokenized once; when its first tokens are exactly ``prompt_ids`` the
    rest is the completion. When BPE merges across the boundary (``"</think>\n\n"`` ends a
    prompt as one ``"\n\n"`` token but splits before a word), the server still saw
    ``prompt_ids`` and generated from there, so the completion is ``text`` tokenized on its own;
    a tokenizer that alters ``text`` alone (e.g. a SentencePiece prefix space) is rejected
    (``token_boundary``).
    """
    full = renderer.encode(prompt + text)
    if full[:len(prompt_ids)] == prompt_ids:
        return full[len(prompt_ids):], False
    alone = renderer.encode(text)
    if renderer.decode(alone) != text:
        raise TurnRejected("token_boundary", "the completion cannot be tokenized apart from the "
                           "prompt without changing it; supply completion_token_ids")
    return alone, True


def _assemble(prompt_ids: list[int], completion: list[int], cut: bool, scaffold: str | None,
              max_seq_len: int) -> Encoded:
    """Concatenate, cut at ``max_seq_len``, build the mask; reject an empty completion."""
    room = max_seq_len - len(prompt_ids)
    truncated = cut or len(completion) > room
    completion = completion[:room]
    if not completion:
        raise TurnRejected("empty_completion", "no supervised token")
    ids = prompt_ids + completion                                # [T]
    mask = [0] * len(prompt_ids) + [1] * len(completion)         # [T]
    return Encoded(ids, mask, len(prompt_ids), truncated, scaffold)


def _render(renderer: Renderer, messages: list[dict[str, Any]], turn: Turn, *,
            generation: bool) -> str:
    try:
        return renderer.render(messages, tools=turn.tools, kwargs=turn.kwargs,
                               add_generation_prompt=generation)
    except TemplateError as err:
        raise TurnRejected("template_error", str(err)) from None


def completion_text(renderer: Renderer, history: list[dict[str, Any]], prompt: str, turn: Turn,
                    rules: Rules) -> tuple[str, str | None]:
    """The text the model generated after ``prompt``, stop token and template tail included,
    and the scaffold handled (None when ``render(history + turn)`` extends ``prompt``).

    Raises ``template_mismatch`` when the renders differ in the history or by an unknown
    scaffold (see the module docstring).
    """
    message = message_for_template(turn.messages[turn.message_index])
    full = _render(renderer, history + [message], turn, generation=False)
    if full.startswith(prompt):
        return full[len(prompt):], _template_think_block(full[len(prompt):], turn, rules)
    past = _render(renderer, history, turn, generation=False)
    if not (prompt.startswith(past) and full.startswith(past)):
        raise TurnRejected("template_mismatch", "the history renders differently with and "
                           f"without the turn (first difference at char {_lcp(prompt, full)})")
    common = _lcp(prompt, full)
    scaffold, rest = prompt[common:], full[common:]
    return _scaffold_completion(scaffold, rest, turn, rules)


def _template_think_block(rest: str, turn: Turn, rules: Rules) -> str | None:
    """``"empty_think_scaffold"`` when the rendered turn of an answer without reasoning starts
    with an empty think block right after the generation prompt (a thinking template in its
    default mode writes ``<think>\n\n</think>\n\n`` itself): it is supervised as if the model
    generated it, so it is counted in the manifest's scaffolds (None otherwise)."""
    if rules.think is None or turn.reasoning.strip():
        return None
    opener, closer = (re.escape(t) for t in rules.think)
    return "empty_think_scaffold" if re.match(rf"\s*{opener}\s*{closer}", rest) else None


def _scaffold_completion(scaffold: str, rest: str, turn: Turn,
                         rules: Rules) -> tuple[str, str]:
    """Completion text for a generation prompt ending in ``scaffold`` that the rendered turn
    lacks (its text is ``rest``); raises ``template_mismatch`` for unknown scaffolds."""
    if rules.think is not None:
        opener, closer = (re.escape(t) for t in rules.think)
        if re.fullmatch(rf"\s*{opener}\s*{closer}\s*", scaffold):
            if turn.reasoning.strip():
                raise TurnRejected("template_mismatch", "the generation prompt holds an empty "
                                   "think block but the turn has reasoning")
            return rest, "empty_think_block"
        if re.fullmatch(rf"\s*{opener}\s*", scaffold):
            joined = rules.reasoning_format.format(reasoning=turn.reasoning.strip("\n"),
                                                   close=rules.think[1])
            return joined + rest.lstrip(), "think_opener"
    raise TurnRejected("template_mismatch", f"the generation prompt ends with {scaffold[:80]!r}, "
                       f"which the rendered turn lacks (rendered: {rest[:80]!r})")


def end_at_stop(renderer: Renderer, completion: list[int], turn: Turn,
                rules: Rules) -> tuple[list[int], bool]:
    """Cut ``completion`` after its first stop token; return ``(ids, cut_by_max_tokens)``.

    Template text after the stop token must be whitespace/special (it is never generated).
    ``finish_reason == "length"``: the model emitted no stop token, so it is dropped too; a turn
    cut inside its reasoning (no answer yet) is rejected, since the template would add a closer
    the model never emitted.
    """
    hits = [i for i, t in enumerate(completion) if t in rules.stop_ids]
    if not hits:
        raise TurnRejected("no_stop_token", f"the rendered turn holds none of the stop tokens "
                           f"{sorted(rules.stop_ids)}; set --stop-tokens")
    j = hits[0]
    if renderer.decode(completion[j + 1:], skip_special=True).strip():
        raise TurnRejected("stop_token_in_content", "a stop token occurs inside the turn's text")
    if turn.finish_reason != "length":
        return completion[:j + 1], False
    content = turn.messages[turn.message_index].get("content") or ""
    if turn.reasoning.strip() and not str(content).strip():
        raise TurnRejected("cut_in_reasoning", "generation hit max_tokens inside the reasoning")
    return completion[:j], True


def check_reasoning_kept(renderer: Renderer, completion: list[int], turn: Turn) -> None:
    """Reject (``reasoning_dropped``) a turn whose reasoning the template did not render: its
    mask would teach the drafter to skip the thinking the model actually generated."""
    wanted = turn.reasoning.strip()
    if wanted and wanted not in renderer.decode(completion):
        raise TurnRejected("reasoning_dropped", "the template does not render this turn's "
                           "reasoning; pass --chat-template with one that does, or token ids")


def _lcp(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings."""
    return len(os.path.commonprefix([a, b]))
