"""Acceptance counting for chain speculative decoding (pure Python, no torch).

One *verify step* checks k drafted tokens in one verifier forward. The drafts accepted are the
longest accepted **prefix** (a draft after a rejected one is never used, whatever its own flag);
the verifier then adds one token (the correction on a rejection, the *bonus* after k accepted
drafts). So a step commits ``accepted + 1`` tokens, and

- τ (mean acceptance length) = committed tokens / verify steps, bonus counted — the figure vLLM
  reports as ``1 + accepted / drafts`` (``vllm:spec_decode_*`` counters) and EAGLE-3
  (arXiv 2503.01840, Sec. 4) calls τ;
- acceptance rate = accepted drafts / drafted tokens;
- per-position rate ``i`` = steps whose draft ``i`` (0-based) was accepted / steps that drafted
  position ``i``.

Stopping: when an accepted draft (or the verifier's token) is an EOS, generation stops there; the
tokens after it are not committed and the committed count says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence


def accepted_prefix(flags: Sequence[bool | int]) -> int:
    """Length of the leading run of accepted drafts: ``[1, 0, 1] -> 1``, ``[1, 1, 1] -> 3``."""
    n = 0
    for f in flags:
        if not f:
            break
        n += 1
    return n


def commit_tokens(drafts: Sequence[int], n_accepted: int, verifier_token: int,
                  eos_ids: Iterable[int]) -> tuple[list[int], bool]:
    """The tokens a step commits and whether generation stops.

    ``drafts[:n_accepted] + [verifier_token]``, cut just after the first EOS (inclusive).
    """
    eos = set(eos_ids)
    tokens = list(drafts[:n_accepted]) + [int(verifier_token)]
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], True
    return tokens, False


#: Context-length buckets of :meth:`AcceptanceStats.by_context`: (label, lowest, highest
#: exclusive) in tokens (issue #26: drafters trained on short rows lose acceptance on long ones).
CONTEXT_BUCKETS = (("<512", 0, 512), ("512-2k", 512, 2048), (">=2k", 2048, None))


@dataclass
class StepRecord:
    """One verify step: drafts proposed, accepted prefix length, tokens committed, and the
    context length L (prompt + tokens committed before the step; 0 = not recorded)."""

    k: int
    accepted: int
    committed: int
    context: int = 0


@dataclass
class AcceptanceStats:
    """Running totals over verify steps (one prompt or a whole set)."""

    steps: list[StepRecord] = field(default_factory=list)

    def add(self, k: int, accepted: int, committed: int, context: int = 0) -> None:
        self.steps.append(StepRecord(k, accepted, committed, context))

    def extend(self, other: "AcceptanceStats") -> None:
        self.steps.extend(other.steps)

    @property
    def verify_steps(self) -> int:
        return len(self.steps)

    @property
    def committed(self) -> int:
        return sum(s.committed for s in self.steps)

    @property
    def drafted(self) -> int:
        return sum(s.k for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify step (bonus counted); 0 without steps."""
        return self.committed / self.verify_steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def per_position(self) -> list[float]:
        """Rate of acceptance of draft position i among the steps that drafted it."""
        k_max = max((s.k for s in self.steps), default=0)
        rates = []
        for i in range(k_max):
            drafted = sum(1 for s in self.steps if s.k > i)
            rates.append(sum(1 for s in self.steps if s.k > i and s.accepted > i) / drafted)
        return rates

    def per_position_accepted(self) -> list[int]:
        """Steps whose draft position i was accepted (vLLM's
        ``spec_decode_num_accepted_tokens_per_pos``)."""
        k_max = max((s.k for s in self.steps), default=0)
        return [sum(1 for s in self.steps if s.k > i and s.accepted > i) for i in range(k_max)]

    def by_context(self, buckets=CONTEXT_BUCKETS) -> dict[str, dict]:
        """τ, per-position rates and step count of the steps whose context length L falls in
        each bucket ``(label, lo, hi)`` (``lo <= L < hi``, ``hi`` None = no bound); empty
        buckets are left out."""
        out = {}
        for label, lo, hi in buckets:
            part = AcceptanceStats([s for s in self.steps
                                    if s.context >= lo and (hi is None or s.context < hi)])
            if part.steps:
                out[label] = {"tau": part.tau, "per_position": part.per_position(),
                              "verify_steps": part.verify_steps}
        return out

    def summary(self) -> dict:
        return {"tau": self.tau, "acceptance_rate": self.acceptance_rate,
                "per_position": self.per_position(),
                "per_position_accepted": self.per_position_accepted(),
                "verify_steps": self.verify_steps,
                "drafted": self.drafted, "accepted": self.accepted, "committed": self.committed,
                "by_context": self.by_context()}


#: The ``draft_sample_method`` values (vLLM's names, ``vllm/config/speculative.py``).
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")


def acceptance_rule(temperature: float, draft_sample_method: str = "greedy") -> str:
    """The rule a run at ``temperature`` applies, in words (recorded beside its figures; the
    rules themselves: :mod:`specdraft.eval.specdec`). Raises ValueError on an unknown method."""
    if temperature <= 0:
        return "greedy: a draft is accepted iff it equals the verifier's argmax"
    if draft_sample_method == "greedy":
        return ("greedy drafting (vLLM draft_sample_method=greedy; SGLang target-only verify): "
                "draft = drafter argmax, accept with p(draft), resample from p without the "
                "draft")
    if draft_sample_method == "probabilistic":
        return ("probabilistic drafting (vLLM draft_sample_method=probabilistic): draft ~ q, "
                "accept with min(1, p/q), resample from max(0, p - q)")
    raise ValueError(f"unknown draft_sample_method {draft_sample_method!r}; one of "
                     f"{', '.join(DRAFT_SAMPLE_METHODS)}")
