"""The verifier's chat template and tokenizer: rendering, tokenizing, and the facts prepare
needs about them (stop token, think tokens, how history reasoning is rendered).

Rendering is ``tokenizer.apply_chat_template(..., tokenize=False)`` with the template and the
``chat_template_kwargs`` of the sample, exactly as an OpenAI-compatible server renders a chat
request. Text is then tokenized with ``add_special_tokens=False`` by default, as vLLM and SGLang
do for chat requests (the template writes BOS itself when the model wants one).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from specdraft.core.errors import ConfigError

DEFAULT_THINK = ("<think>", "</think>")
_PROBE_ANSWER = "SPECDRAFTPROBEANSWER"
_PROBE_REASONING = "SPECDRAFTPROBEREASONING"
_BYTE_FALLBACK = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


class TemplateError(Exception):
    """The chat template raised while rendering a sample (becomes a ``template_error`` reject)."""


@dataclass
class Renderer:
    """A tokenizer plus the chat template used with it.

    ``template`` is the Jinja source actually used (the tokenizer's or an override file's).
    """

    tokenizer: Any
    template: str
    add_special_tokens: bool = False
    _special: set[int] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self._special = set(self.tokenizer.all_special_ids) | set(added_token_ids(self.tokenizer))

    def render(self, messages: list[dict[str, Any]], *, tools: list | None,
               kwargs: dict[str, Any], add_generation_prompt: bool) -> str:
        """The template's text for ``messages``; raises :class:`TemplateError` on any template
        exception (e.g. ``raise_exception`` for unsupported role orders)."""
        extra = {"tools": tools} if tools else {}
        try:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                chat_template=self.template, **extra, **kwargs)
        except Exception as err:  # jinja2 raises many types; all mean "cannot render"
            raise TemplateError(f"{type(err).__name__}: {err}") from None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (one tokenization of the whole string)."""
        return list(self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"])

    def decode(self, ids: list[int], *, skip_special: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special,
                                     clean_up_tokenization_spaces=False)

    def is_special(self, token_id: int) -> bool:
        """True for special and added tokens (``<|im_end|>``, ``<think>``, tool tags...)."""
        return token_id in self._special

    @property
    def template_hash(self) -> str:
        """sha256 of the template text (hex)."""
        return hashlib.sha256(self.template.encode("utf-8")).hexdigest()


def added_token_ids(tokenizer: Any) -> list[int]:
    """Ids of the tokenizer's added tokens (special or not), sorted."""
    return sorted(int(i) for i in tokenizer.added_tokens_decoder)


def single_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` when it is exactly one token of the vocabulary, else None."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) == 1 and tokenizer.decode(ids) == text:
        return int(ids[0])
    return None


def resolve_think_tokens(tokenizer: Any, configured: tuple[str, str] | None
                         ) -> tuple[tuple[str, str], tuple[int, int]] | None:
    """``((opener, closer), (opener_id, closer_id))`` or None for a non-reasoning tokenizer.

    Configured tokens that are not single tokens raise :class:`ConfigError` (fail at start).
    Unconfigured: ``<think>``/``</think>`` when both are single tokens (Qwen3, DeepSeek-R1,
    Kimi-K2.5 use these strings), else None.
    """
    names = configured or DEFAULT_THINK
    ids = tuple(single_token_id(tokenizer, n) for n in names)
    if None in ids:
        if configured:
            missing = [n for n, i in zip(names, ids) if i is None]
            raise ConfigError(f"--think-tokens: {missing} not single tokens of the verifier's "
                              f"vocabulary")
        return None
    return names, ids  # type: ignore[return-value]


def detect_stop_ids(renderer: Renderer, configured: tuple[str, ...] | None) -> list[int]:
    """Ids of the token(s) the model emits to end its turn.

    Configured names must be single tokens (else :class:`ConfigError`). Otherwise a probe
    conversation is rendered and the first special token after the assistant's text is taken
    (``<|im_end|>`` for ChatML, ``<|eot_id|>`` for Llama 3); the eos token when there is none.
    """
    tok = renderer.tokenizer
    if configured:
        ids = [single_token_id(tok, n) for n in configured]
        if None in ids:
            raise ConfigError(f"--stop-tokens: {list(configured)} must each be one token of the "
                              f"verifier's vocabulary")
        return [int(i) for i in ids]  # type: ignore[arg-type]
    probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _PROBE_ANSWER}]
    try:
        text = renderer.render(probe, tools=None, kwargs={}, add_generation_prompt=False)
    except TemplateError:
        text = ""
    if _PROBE_ANSWER in text:
        tail = text[text.rindex(_PROBE_ANSWER) + len(_PROBE_ANSWER):]
        for token_id in renderer.encode(tail):
            if renderer.is_special(token_id):
                return [token_id]
    if tok.eos_token_id is None:
        raise ConfigError("cannot tell which token ends an assistant turn: pass --stop-tokens")
    return [int(tok.eos_token_id)]


def history_policy(renderer: Renderer, think: tuple[str, str] | None) -> dict[str, str]:
    """How the template renders reasoning: of earlier assistant turns (``kept``/``stripped``)
    and of the turn being supervised (``rendered``/``dropped``). Found by rendering probes."""
    def has_probe(messages: list[dict[str, Any]]) -> str:
        try:
            text = renderer.render(messages, tools=None, kwargs={}, add_generation_prompt=False)
        except TemplateError:
            return "unknown"
        return "yes" if _PROBE_REASONING in text else "no"

    reasoned = with_reasoning_fields({"role": "assistant", "content": "A1"}, _PROBE_REASONING)
    earlier = has_probe([{"role": "user", "content": "U1"}, reasoned,
                         {"role": "user", "content": "U2"},
                         {"role": "assistant", "content": "A2"}])
    last = has_probe([{"role": "user", "content": "U1"}, reasoned])
    names = {"yes": "kept", "no": "stripped", "unknown": "unknown"}
    return {"earlier_turns_reasoning": names[earlier],
            "supervised_turn_reasoning": {"yes": "rendered", "no": "dropped",
                                          "unknown": "unknown"}[last],
            "think_tokens": "configured or found" if think else "none"}


def with_reasoning_fields(message: dict[str, Any], reasoning: str | None) -> dict[str, Any]:
    """``message`` with its reasoning under every field name templates read.

    Qwen3 and Kimi read ``reasoning_content``; gpt-oss reads ``thinking``; vLLM's current chat
    field is ``reasoning`` (PR #27752). Empty reasoning sets none of them, so templates that test
    ``is defined`` fall back to their own handling.
    """
    out = {k: v for k, v in message.items()
           if k not in ("reasoning", "reasoning_content", "thinking")}
    if reasoning:
        out.update(reasoning=reasoning, reasoning_content=reasoning, thinking=reasoning)
    return out


def template_special_ids(renderer: Renderer) -> list[int]:
    """Ids of added/special tokens whose text occurs in the chat template (turn markers, tool
    tags, think tokens), sorted: the draft vocabulary always keeps these."""
    tok = renderer.tokenizer
    return sorted(int(i) for i, t in tok.added_tokens_decoder.items()
                  if t.content and t.content in renderer.template)


def byte_fallback_ids(tokenizer: Any) -> list[int]:
    """Ids of SentencePiece byte-fallback tokens ``<0x00>``..``<0xFF>`` (empty for byte-level
    BPE, whose base alphabet already covers every byte)."""
    return sorted(int(i) for t, i in tokenizer.get_vocab().items() if _BYTE_FALLBACK.match(t))
