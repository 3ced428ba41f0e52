"""Progress of a generate run: a log line at a steady cadence, a bar on a TTY, a final summary.

The line reads ``Progress: 9850/10000 (0 errors), 0.5 req/s, avg completion: 1941 tokens,
elapsed: 18547s, ETA: 0.1h`` (req/s = finished samples per wall second of this run).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any, Callable, TextIO

from specdraft.core.progress import StageProgress


def progress_line(done: int, total: int, errors: int, elapsed_s: float,
                  completion_tokens: int) -> str:
    """The progress line for ``done`` of ``total`` samples after ``elapsed_s`` seconds."""
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    avg = completion_tokens / done if done else 0.0
    eta = f"{(total - done) / rate / 3600:.1f}h" if rate > 0 else "?"
    return (f"Progress: {done}/{total} ({errors} errors), {rate:.1f} req/s, "
            f"avg completion: {avg:.0f} tokens, elapsed: {elapsed_s:.0f}s, ETA: {eta}")


class Progress:
    """Counts finished samples; shows them through the shared stage progress
    (:class:`specdraft.core.progress.StageProgress`): :func:`progress_line` every ``interval_s``
    seconds on a log (a heartbeat prints it even while a long batch runs), a ``tqdm`` bar on a
    TTY."""

    def __init__(self, total: int, *, interval_s: float = 30.0, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.interval_s = interval_s
        self.stream = stream or sys.stderr
        self.clock = clock
        self.t0 = clock()
        self.done = 0
        self.generated = 0
        self.errors = 0
        self.rejected: Counter[str] = Counter()
        self.completion_tokens = 0
        self.with_reasoning = 0
        self.sequence_tokens = 0      # whole conversations of the generated samples
        self.response_tokens = 0      # their completions
        self.tokenized = 0            # generated samples whose token ids the backend returned
        self.unique: set[int] = set()  # distinct ids over those samples
        self._shown = StageProgress("generate", total=total, unit="samples", stream=self.stream,
                                    interval_s=interval_s, clock=clock, render=self._line)

    def _line(self, elapsed_s: float) -> str:
        return progress_line(self.done, self.total, self.errors, elapsed_s,
                             self.completion_tokens)

    def set_total(self, total: int) -> None:
        """Set the number of samples to do (a TTY's bar is redrawn)."""
        self.total = total
        self._shown.set_total(total)

    def start(self, message: str) -> None:
        """Print ``message`` now (the run's first line, before any sample finishes) and start
        the heartbeat: from here a line comes at least every ``interval_s`` seconds."""
        self._shown.write(message)
        self._shown.start()

    def update(self, *, reject: str | None, completion_tokens: int, reasoning: bool,
               sequence_tokens: int = 0, token_ids: set[int] | None = None,
               emit: bool = True) -> None:
        """One sample finished (``reject`` = its reason, or None when generated).

        ``emit=False``: count it without printing (a batch that finishes together is printed
        once, after its last sample: :meth:`tick`; else the line would read "1/240" with the
        rest of the batch already done, and an ETA from that one sample).

        ``completion_tokens``: all its turns' completions (counted for every finished sample:
        the work done); ``sequence_tokens``: its whole conversation (last prompt + completion);
        ``token_ids``: its distinct ids, None when the backend returned none."""
        self.done += 1
        self.completion_tokens += completion_tokens
        if reject is None:
            self.generated += 1
            self.with_reasoning += int(reasoning)
            self.sequence_tokens += sequence_tokens
            self.response_tokens += completion_tokens
            if token_ids is not None:
                self.tokenized += 1
                self.unique |= token_ids
        else:
            self.rejected[reject] += 1
            self.errors += int(reject == "error")
        self._shown.update(1, emit=emit)

    def tick(self) -> None:
        """Print the progress line if the cadence is due."""
        self._shown.tick()

    def close(self) -> None:
        """Stop the heartbeat; close the bar (no final line: the summary follows)."""
        self._shown.close(final=False)

    def summary(self) -> dict[str, Any]:
        """Final figures of this run (samples finished now, not those skipped by resume).

        ``rejected`` are the samples skipped, by reason; ``completion_tokens`` counts every
        finished sample's completions (``tokens_per_s`` is this over the elapsed time), the
        ``total_tokens`` / ``response_tokens`` / ``mean_*`` / ``unique_tokens`` figures only
        the generated samples' (``unique_tokens`` None when the backend returned no ids)."""
        elapsed = max(self.clock() - self.t0, 1e-9)
        n = max(self.generated, 1)
        return {
            "finished": self.done, "generated": self.generated, "tokenized": self.tokenized,
            "rejected": dict(sorted(self.rejected.items())),
            "errors": self.errors, "with_reasoning": self.with_reasoning,
            "with_reasoning_pct": round(100 * self.with_reasoning / max(self.generated, 1), 1),
            "completion_tokens": self.completion_tokens,
            "completion_tokens_mean": round(self.completion_tokens / max(self.done, 1), 1),
            "total_tokens": self.sequence_tokens, "response_tokens": self.response_tokens,
            "mean_seq_len": round(self.sequence_tokens / n, 1),
            "mean_response_len": round(self.response_tokens / n, 1),
            "unique_tokens": len(self.unique) if self.tokenized else None,
            "elapsed_s": round(elapsed, 3), "req_per_s": round(self.done / elapsed, 3),
            "tokens_per_s": round(self.completion_tokens / elapsed, 1),
        }


def format_summary(s: dict[str, Any]) -> str:
    """Human-readable lines for :meth:`Progress.summary`."""
    rej = ", ".join(f"{k}={v}" for k, v in s["rejected"].items()) or "none"
    unique = "?" if s["unique_tokens"] is None else s["unique_tokens"]
    t = s.get("turns") or {}
    tools = [f"tool calling: {t['samples_with_tools']} samples, {t['regenerated']} turns "
             f"regenerated, {t['kept']} data tool calls kept, {t['tool_call_answers']} answers "
             f"calling tools, {t['not_generated_after_tool_call']} turns not generated after "
             f"a tool call"] if t.get("samples_with_tools") else []
    return "\n".join([
        f"generated: {s['generated']}   tokenized: {s['tokenized']} (ids from the backend)   "
        f"skipped: {sum(s['rejected'].values())} ({rej})   errors: {s['errors']}",
        f"with reasoning: {s['with_reasoning']} ({s['with_reasoning_pct']}%)",
        f"tokens: {s['total_tokens']} total, {s['response_tokens']} response   mean sequence "
        f"{s['mean_seq_len']}, mean response {s['mean_response_len']}   unique: {unique}",
        f"completion tokens (all finished): {s['completion_tokens']} total, "
        f"{s['completion_tokens_mean']} mean",
        f"elapsed: {s['elapsed_s']:.1f}s   {s['req_per_s']:.2f} req/s   "
        f"{s['tokens_per_s']:.1f} tokens/s",
    ] + tools)
