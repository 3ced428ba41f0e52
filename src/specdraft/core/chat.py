"""The verifier's chat format: the one place where specdraft renders chats and decides what a
template sees.

A :class:`ChatFormat` is resolved once, by the first stage that touches the tokenizer (``generate``
with the local backend, else ``prepare``), saved as ``RUN/<stage>/chat_format.json`` and used by
every stage that renders a chat: local generation, prepare, eval and doctor. It holds the template
text and its sha256, the default ``chat_template_kwargs``, special-token handling, the stop
(end-of-turn) ids, the think markers, the message fields reasoning is handed to the template
under, and how the template renders reasoning of earlier and supervised turns.

Rendering is ``tokenizer.apply_chat_template(..., tokenize=False)`` with the template and the
``chat_template_kwargs`` of the sample, exactly as an OpenAI-compatible server renders a chat
request. Text is then tokenized with ``add_special_tokens=False`` by default, as vLLM and SGLang
do for chat requests (the template writes BOS itself when the model wants one).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from specdraft.core.errors import ConfigError
from specdraft.core.jsonl import read_model

#: Think markers of Qwen3, DeepSeek-R1 and Kimi-K2.5 (their tokenizer_config.json templates).
DEFAULT_THINK = ("<think>", "</think>")
#: Message fields templates read reasoning from, in the order a message's reasoning is looked up:
#: vLLM's chat field ``reasoning`` (PR #27752), ``reasoning_content`` (Qwen3, Kimi, SGLang,
#: llama.cpp), ``thinking`` (gpt-oss).
TEMPLATE_REASONING_FIELDS = ("reasoning", "reasoning_content", "thinking")
#: Fields servers carry reasoning in, in chat messages both ways, in order of preference: vLLM's
#: responses set ``reasoning`` (older vLLM, SGLang, llama.cpp, DeepSeek API ``reasoning_content``);
#: vLLM 0.32 reads a request's ``reasoning`` and hands it to the template as ``reasoning`` and
#: ``reasoning_content`` (``vllm/renderers/chat_utils.py``); SGLang and llama.cpp read
#: ``reasoning_content``.
SERVER_REASONING_FIELDS = ("reasoning", "reasoning_content")
CHAT_FORMAT_FILE = "chat_format.json"
#: ShareGPT ``from`` values (lower-cased) -> OpenAI roles, for every reader of ShareGPT files
#: (generate's prompt files, prepare's conversation files).
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant",
                  "bard": "assistant", "model": "assistant", "function_call": "assistant",
                  "tool": "tool", "function_response": "tool", "observation": "tool"}
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
    out = {k: v for k, v in message.items() if k not in TEMPLATE_REASONING_FIELDS}
    if reasoning:
        out.update({name: reasoning for name in TEMPLATE_REASONING_FIELDS})
    return out


def message_reasoning(message: dict[str, Any]) -> str:
    """The first non-empty of :data:`TEMPLATE_REASONING_FIELDS` in ``message`` (or ``""``)."""
    for key in TEMPLATE_REASONING_FIELDS:
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return ""


def content_text(content: Any) -> str | None:
    """A message's OpenAI ``content`` as text: a string as is, None as None, a list of content
    parts (``[{"type": "text", "text": ...}, ...]``) as its texts joined with ``"\\n"``, which is
    how vLLM renders parts for a template that takes string content
    (``vllm/renderers/chat_utils.py``, ``"\\n".join(texts)``).

    Raises :class:`ValueError` naming the part for anything else: a non-text part (an image
    has no text to train on), a part without a string ``text``, or content of another type.
    """
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"must be a string or a list of text parts, got "
                         f"{type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type", "text") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ValueError(f"part {j} is not a text part ({{'type': 'text', 'text': str}})")
        texts.append(part["text"])
    return "\n".join(texts)


def message_for_template(message: dict[str, Any]) -> dict[str, Any]:
    """A message as templates expect it: reasoning under every field name, None content as
    ``""`` (string concatenation in templates fails on None), tool calls with their arguments
    as objects (:func:`template_tool_calls`)."""
    out = with_reasoning_fields(message, message_reasoning(message))
    if out.get("content") is None:
        out["content"] = ""
    if out.get("role") == "assistant" and isinstance(out.get("tool_calls"), list):
        calls = template_tool_calls(out["tool_calls"])
        if calls:
            out["tool_calls"] = calls
        else:
            out.pop("tool_calls")
    return out


def template_tool_calls(calls: list[Any]) -> list[Any]:
    """An assistant message's ``tool_calls`` as a server hands them to the chat template: each
    ``function.arguments`` JSON string parsed to an object (``{}`` when empty, not JSON or not an
    object), as vLLM does before rendering (``vllm/renderers/chat_utils.py``,
    ``_postprocess_messages``; transformers' chat-template docs ask for objects), so a template's
    ``arguments | tojson`` renders the same text here and on the server. Entries that are not
    function calls are passed through unchanged (the template decides)."""
    import json

    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            out.append(call)
            continue
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                args = {}
        out.append({**call, "function": {**fn, "arguments": args
                                         if isinstance(args, dict) else {}}})
    return out


#: Fields of a history message that carry tool calling, sent to the server as they are
#: (``tool_calls`` of an assistant turn, ``tool_call_id``/``name`` of a tool result, the legacy
#: ``function_call``).
REQUEST_TOOL_FIELDS = ("tool_calls", "tool_call_id", "name", "function_call")


def message_for_request(message: dict[str, Any]) -> dict[str, Any]:
    """A history message as sent to an OpenAI-compatible server: ``role``, ``content``, its tool
    fields (:data:`REQUEST_TOOL_FIELDS`) and, for an assistant turn with reasoning, that reasoning
    under :data:`SERVER_REASONING_FIELDS`, so the server's template renders the history exactly as
    :func:`message_for_template` does here."""
    out = {"role": message["role"], "content": message.get("content") or ""}
    out.update({k: message[k] for k in REQUEST_TOOL_FIELDS if message.get(k) not in (None, [])})
    reasoning = message_reasoning(message) if message["role"] == "assistant" else ""
    if reasoning:
        out.update({name: reasoning for name in SERVER_REASONING_FIELDS})
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


class ThinkMarkers(BaseModel):
    """The verifier's reasoning markers and their (single-token) ids."""

    model_config = ConfigDict(frozen=True)
    opener: str
    closer: str
    opener_id: int
    closer_id: int


class ChatFormat(BaseModel):
    """How the verifier's chats are rendered: resolved once (:meth:`resolve`), stored in the run
    (``RUN/verifier.json``'s ``chat``, read through
    :func:`specdraft.artifacts.verifier_contract.run_verifier`; :meth:`save` records each stage's
    own) and used by every stage that renders a chat.

    ``kwargs``: the ``chat_template_kwargs`` of requests that carry none of their own (a sample's
    own, recorded by generate, win). ``history_reasoning``: whether the template renders the
    reasoning of earlier assistant turns (``kept``/``stripped``); ``supervised_reasoning``: of the
    turn being generated (``rendered``/``dropped``); both found by rendering probes.
    """

    model_config = ConfigDict(frozen=True)
    template: str
    template_sha256: str
    template_source: str
    kwargs: dict[str, Any] = {}
    add_special_tokens: bool = False
    stop_token_ids: list[int]
    stop_tokens: list[str]
    think: ThinkMarkers | None = None
    template_reasoning_fields: list[str] = list(TEMPLATE_REASONING_FIELDS)
    request_reasoning_fields: list[str] = list(SERVER_REASONING_FIELDS)
    history_reasoning: Literal["kept", "stripped", "unknown"] = "unknown"
    supervised_reasoning: Literal["rendered", "dropped", "unknown"] = "unknown"

    @classmethod
    def resolve(cls, tokenizer: Any, *, chat_template: str | Path | None = None,
                kwargs: dict[str, Any] | None = None, add_special_tokens: bool = False,
                think_tokens: tuple[str, str] | None = None,
                stop_tokens: tuple[str, ...] | None = None) -> "ChatFormat":
        """The chat format of ``tokenizer`` (or of the template file ``chat_template``).

        Raises :class:`ConfigError` naming the flag when the tokenizer has no template, the file
        is missing, or configured think/stop tokens are not single tokens.
        """
        template, source = _template_text(tokenizer, chat_template)
        renderer = Renderer(tokenizer, template, add_special_tokens)
        think = resolve_think_tokens(tokenizer, think_tokens)
        stop_ids = detect_stop_ids(renderer, stop_tokens)
        policy = history_policy(renderer, think[0] if think else None)
        return cls(template=template, template_sha256=renderer.template_hash,
                   template_source=source, kwargs=dict(kwargs or {}),
                   add_special_tokens=add_special_tokens, stop_token_ids=stop_ids,
                   stop_tokens=[tokenizer.convert_ids_to_tokens(i) for i in stop_ids],
                   think=ThinkMarkers(opener=think[0][0], closer=think[0][1],
                                      opener_id=think[1][0], closer_id=think[1][1])
                   if think else None,
                   history_reasoning=policy["earlier_turns_reasoning"],
                   supervised_reasoning=policy["supervised_turn_reasoning"])

    def renderer(self, tokenizer: Any) -> Renderer:
        """A :class:`Renderer` of ``tokenizer`` with this format's template."""
        return Renderer(tokenizer, self.template, self.add_special_tokens)

    @property
    def think_names(self) -> tuple[str, str] | None:
        return (self.think.opener, self.think.closer) if self.think else None

    def prompt_ids(self, tokenizer: Any, messages: list[dict[str, Any]], *,
                   tools: list | None = None, kwargs: dict[str, Any] | None = None) -> list[int]:
        """Token ids ``[T]`` of the generation prompt of ``messages`` (history reasoning handed
        to the template as :func:`message_for_template` does), exactly what a server feeds the
        verifier for this chat request. Raises :class:`TemplateError`."""
        renderer = self.renderer(tokenizer)
        text = renderer.render([message_for_template(m) for m in messages], tools=tools,
                               kwargs=self.kwargs if kwargs is None else kwargs,
                               add_generation_prompt=True)
        return renderer.encode(text)

    def rendering_differs(self, other: "ChatFormat") -> list[str]:
        """Names of the fields that make ``other`` render chats differently from this one."""
        keys = ("template_sha256", "kwargs", "add_special_tokens", "stop_token_ids", "think",
                "template_reasoning_fields")
        return [k for k in keys if getattr(self, k) != getattr(other, k)]

    def save(self, stage_dir: str | Path) -> Path:
        """Write ``stage_dir/chat_format.json`` atomically; return its path."""
        from specdraft.core.atomic import atomic_write_json

        path = Path(stage_dir) / CHAT_FORMAT_FILE
        atomic_write_json(path, self.model_dump(mode="json"))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "ChatFormat":
        """Read a ``chat_format.json``; :class:`InputError` naming the file when unreadable."""
        return read_model(path, cls, what="chat format")

    def summary(self) -> dict[str, Any]:
        """The manifest's view: everything but the template text."""
        return self.model_dump(mode="json", exclude={"template"})


def _template_text(tokenizer: Any, chat_template: str | Path | None) -> tuple[str, str]:
    """``(template text, where it came from)``: the override file, else the tokenizer's."""
    if chat_template is not None:
        path = Path(chat_template)
        if not path.is_file():
            raise ConfigError(f"--chat-template {path}: file not found")
        return path.read_text(encoding="utf-8"), str(path)
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ConfigError("the tokenizer has no chat template: pass --chat-template FILE")
    if isinstance(template, dict):  # several named templates: the default one renders chats
        template = template.get("default") or next(iter(template.values()))
    return template, "tokenizer"


def generation_stop_ids(model: Any, tokenizer: Any, fmt: ChatFormat | None = None) -> list[int]:
    """The ids a serving engine stops a greedy generation at, in first-seen order: the chat
    format's end-of-turn ids, the model's ``generation_config.eos_token_id`` (int or list) and the
    tokenizer's ``eos_token_id`` (vLLM adds the generation config's eos ids to every request's
    stop ids: ``vllm/transformers_utils/config.py`` ``try_get_generation_config``). Used by local
    generation and by eval."""
    ids: list[int] = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (fmt.stop_token_ids if fmt else None, gen_eos, tokenizer.eos_token_id):
        for i in (value if isinstance(value, (list, tuple)) else [value]):
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


def run_chat_format(run_dir: str | Path | None) -> ChatFormat | None:
    """The chat format a run recorded in its stage directories: ``RUN/prepare/chat_format.json``,
    else ``RUN/generate/chat_format.json`` (local generation), else None. Only the fallback of
    :func:`specdraft.artifacts.verifier_contract.run_verifier` for a run without
    ``RUN/verifier.json``; every stage reads the run's format through that reader."""
    if run_dir is None:
        return None
    for stage in ("prepare", "generate"):
        path = Path(run_dir) / stage / CHAT_FORMAT_FILE
        if path.exists():
            return ChatFormat.load(path)
    return None
