"""Turn backend outputs into ``generate/samples.jsonl`` records or rejects.

A sample is answered turn by turn: the verifier's own answer to turn ``k`` is in the history of
turn ``k+1``. The first turn that fails a check rejects the whole sample with that reason; later
turns are not generated.

A conversation with tool calling plays its :attr:`~specdraft.artifacts.prompts.Prompt.script`:
the data's kept messages (user turns, tool calls followed by their results, the results) go
into the history as they are, and the verifier answers each slot, with the row's ``tools`` and
``tool_choice`` in every request. An answer with ``tool_calls`` is kept whole (content,
reasoning and the calls as the server parsed them). When such an answer is not the last turn,
the sample ends there: the data has no result for that call, so the later turns are not
generated (counted as ``not_generated_after_tool_call``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdraft.core.chat import DEFAULT_THINK, message_for_request
from specdraft.generate.client import TurnOutput
from specdraft.artifacts.prompts import TOOL_ROLES, Prompt
from specdraft.core.reasoning import Split, extract

#: Reject reasons of this stage (``error`` ones are retried by ``--resume``).
REASONS = ("truncated", "malformed_think", "empty_answer", "empty_reasoning", "error",
           "duplicate")


@dataclass(frozen=True)
class Checks:
    """What makes a turn a reject: think tags, ``require_reasoning``, ``malformed_think``."""

    open_tag: str = DEFAULT_THINK[0]
    close_tag: str = DEFAULT_THINK[1]
    require_reasoning: bool = False
    malformed_think: str = "reject"
    keep_truncated: bool = False


def verdict(split: Split, finish_reason: str | None, checks: Checks, *,
            tool_calls: bool = False) -> tuple[str, str] | None:
    """``(reason, detail)`` when the turn must be rejected, else None. Order: truncated,
    malformed_think, empty_answer (not for an answer that calls tools: the calls are its
    answer), empty_reasoning."""
    if finish_reason == "length" and not checks.keep_truncated:
        return "truncated", "finish_reason=length (raise --max-tokens, or --keep-truncated)"
    if split.problem and checks.malformed_think == "reject":
        return "malformed_think", split.problem
    if not split.content.strip() and not tool_calls:
        return "empty_answer", f"no answer text (reasoning_source={split.source})"
    if checks.require_reasoning and not (split.reasoning or "").strip():
        return "empty_reasoning", "no reasoning although --require-reasoning"
    return None


@dataclass
class SampleState:
    """The conversation of one prompt being generated; :meth:`add` one turn at a time.

    ``kept``: message indices of the data's assistant turns kept as they are (tool calls
    followed by their results); ``stopped``: why the sample ended before its last turn (an
    answer calling a tool the data has no result for), else None."""

    prompt: Prompt
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    reject: tuple[str, str] | None = None
    last: TurnOutput | None = None
    kept: list[int] = field(default_factory=list)
    stopped: str | None = None
    _pos: int = 0  # the next item of the prompt's script

    def __post_init__(self) -> None:
        if self.prompt.system is not None and not self.messages:
            self.messages.append({"role": "system", "content": self.prompt.system})

    @property
    def done(self) -> bool:
        return (self.reject is not None or self.stopped is not None
                or len(self.turns) == self.prompt.slots)

    def request(self) -> list[dict[str, Any]]:
        """The messages to send for the next turn: earlier answers keep their reasoning
        (:func:`specdraft.core.chat.message_for_request`), so the server's template renders the
        history exactly as ``prepare`` renders it; whether the template then shows it is the
        template's own rule. A script's kept messages up to its next slot are added first."""
        script = self.prompt.script
        if script is not None:
            while script[self._pos] is not None:
                if script[self._pos]["role"] == "assistant":
                    self.kept.append(len(self.messages))
                self.messages.append(script[self._pos])
                self._pos += 1
        elif not self.messages or self.messages[-1]["role"] != "user":
            self.messages.append({"role": "user", "content": self.prompt.turns[len(self.turns)]})
        return [message_for_request(m) for m in self.messages]

    def request_fields(self) -> dict[str, Any]:
        """Fields sent with each request of this conversation besides its messages: the row's
        ``tools`` and ``tool_choice``, when it has them."""
        fields: dict[str, Any] = {}
        if self.prompt.tools:
            fields["tools"] = self.prompt.tools
        if self.prompt.tool_choice is not None:
            fields["tool_choice"] = self.prompt.tool_choice
        return fields

    def add(self, out: TurnOutput, checks: Checks) -> None:
        """Record the answer to the pending turn; set :attr:`reject` if it fails a check, and
        :attr:`stopped` when it calls a tool before the conversation's last turn."""
        split = extract(out.message, open_tag=checks.open_tag, close_tag=checks.close_tag)
        calls = out.message.get("tool_calls") or []
        message = {"role": "assistant", "content": split.content, "reasoning": split.reasoning}
        if calls:
            message["tool_calls"] = calls
        self.messages.append(message)
        self._pos += 1
        turn = {"message_index": len(self.messages) - 1, "finish_reason": out.finish_reason,
                "reasoning_source": split.source, "usage": out.usage,
                "completion_token_ids": out.completion_token_ids,
                "prompt_token_ids": out.prompt_token_ids, "latency_s": out.latency_s,
                "attempts": out.attempts, "endpoint": out.endpoint}
        if calls:
            turn["tool_calls"] = len(calls)
        if split.problem:
            turn["think_problem"] = split.problem
        self.turns.append(turn)
        self.last = out
        bad = verdict(split, out.finish_reason, checks, tool_calls=bool(calls))
        if bad is not None:
            self.reject = (bad[0], f"turn {len(self.turns) - 1}: {bad[1]}")
        elif calls and not self.done:
            self.stopped = (f"turn {len(self.turns) - 1} calls a tool the data has no result "
                            f"for: {self.prompt.slots - len(self.turns)} later turn(s) not "
                            f"generated")

    def tool_counts(self) -> dict[str, int]:
        """What this sample adds to the run's turn counts (docs/stages.md, "Tool calling")."""
        return {"regenerated": len(self.turns), "kept": len(self.kept),
                "tool_call_answers": sum(1 for t in self.turns if t.get("tool_calls")),
                "tool_results_kept": sum(1 for m in self.messages if m["role"] in TOOL_ROLES),
                "not_generated_after_tool_call": self.prompt.slots - len(self.turns)
                if self.stopped else 0,
                "samples_with_tools": int(self.prompt.script is not None)}

    def fail(self, kind: str, message: str, attempts: int) -> None:
        """The pending turn's request failed for good: reject with reason ``error``."""
        self.reject = ("error", f"turn {len(self.turns)}: {kind}: {message} "
                                f"(after {attempts} attempts)")

    def record(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The ``samples.jsonl`` record (``meta``: chat_template_kwargs, sampling, backend)."""
        last = self.last
        rec = {"id": self.prompt.id, "messages": self.messages, "turns": self.turns,
               "tools": self.prompt.tools, **meta, "model": last.model if last else None,
               "endpoint": last.endpoint if last else None, "source": self.prompt.source}
        if self.prompt.script is not None:
            rec.update(tool_choice=self.prompt.tool_choice, kept_turns=self.kept,
                       stopped=self.stopped)
        return rec

    def reject_fields(self) -> dict[str, Any]:
        """Extra fields of the reject line: source, messages so far (for inspection), turns."""
        return {"source": self.prompt.source, "messages": self.messages, "turns": self.turns}

    def completion_tokens(self) -> int:
        return sum(int(t["usage"].get("completion_tokens") or 0) for t in self.turns)

    def sequence_tokens(self) -> int:
        """Tokens of the whole conversation: the last turn's prompt (earlier turns included)
        plus its completion, from the server's ``usage``."""
        if not self.turns:
            return 0
        usage = self.turns[-1]["usage"]
        return int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)

    def token_ids(self) -> set[int] | None:
        """The distinct ids of the conversation (last prompt's ids and every completion's),
        None when the backend returned no ids for some turn."""
        if not self.turns or self.turns[-1].get("prompt_token_ids") is None or any(
                t.get("completion_token_ids") is None for t in self.turns):
            return None
        ids = set(self.turns[-1]["prompt_token_ids"])
        for t in self.turns:
            ids.update(t["completion_token_ids"])
        return ids

    def has_reasoning(self) -> bool:
        return any(m.get("reasoning") for m in self.messages if m["role"] == "assistant")
