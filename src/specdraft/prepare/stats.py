"""The prepare summary: figures printed at the end and stored in the manifest."""

from __future__ import annotations

from typing import Any

import numpy as np


class Summary:
    """Accumulates the figures of the rows written (token counts in tokens).

    ``vocab_size`` bounds the token ids seen (ids >= it grow the table).
    """

    def __init__(self, vocab_size: int) -> None:
        self.samples_in = 0
        self.turns_in = 0
        self.rows = 0
        self.with_reasoning = 0
        self.truncated = 0
        self.total_tokens = 0
        self.supervised_tokens = 0
        self.scaffolds: dict[str, int] = {}
        self._seen = np.zeros(vocab_size, dtype=bool)            # [V]
        self._seen_supervised = np.zeros(vocab_size, dtype=bool)  # [V]

    def add_row(self, ids: list[int], mask: list[int], *, reasoning: bool, truncated: bool,
                scaffold: str | None) -> None:
        arr = np.asarray(ids, dtype=np.int64)                    # [T]
        sup = arr[np.asarray(mask, dtype=bool)]                  # [n_sup]
        if arr.max() >= len(self._seen):
            self._grow(int(arr.max()) + 1)
        self._seen[arr] = True
        self._seen_supervised[sup] = True
        self.rows += 1
        self.with_reasoning += int(reasoning)
        self.truncated += int(truncated)
        self.total_tokens += len(arr)
        self.supervised_tokens += len(sup)
        if scaffold:
            self.scaffolds[scaffold] = self.scaffolds.get(scaffold, 0) + 1

    def _grow(self, size: int) -> None:
        for name in ("_seen", "_seen_supervised"):
            old = getattr(self, name)
            new = np.zeros(size, dtype=bool)
            new[:len(old)] = old
            setattr(self, name, new)

    def seen_special(self, special_ids: list[int]) -> list[int]:
        """Those of ``special_ids`` that occur in any written row."""
        return [i for i in special_ids if i < len(self._seen) and self._seen[i]]

    def figures(self, rejected: dict[str, int], elapsed_s: float | None = None
                ) -> dict[str, Any]:
        """The summary (averages per written row; percentages of written rows); with
        ``elapsed_s`` (wall seconds of the stage) also the rates: input samples and written
        tokens per second."""
        rows = max(self.rows, 1)
        rates = {} if elapsed_s is None else {
            "elapsed_s": round(elapsed_s, 3),
            "samples_per_s": round(self.samples_in / max(elapsed_s, 1e-9), 3),
            "tokens_per_s": round(self.total_tokens / max(elapsed_s, 1e-9), 1)}
        return {
            "samples_in": self.samples_in,
            "turns_in": self.turns_in,
            "tokenized": self.rows,
            "rejected": sum(rejected.values()),
            "rejected_by_reason": dict(sorted(rejected.items())),
            "with_reasoning": self.with_reasoning,
            "with_reasoning_pct": round(100.0 * self.with_reasoning / rows, 2),
            "truncated": self.truncated,
            "total_tokens": self.total_tokens,
            "supervised_tokens": self.supervised_tokens,
            "avg_seq_len": round(self.total_tokens / rows, 3),
            "avg_response_len": round(self.supervised_tokens / rows, 3),
            "unique_tokens": int(self._seen.sum()),
            "unique_supervised_tokens": int(self._seen_supervised.sum()),
            "scaffolds": dict(sorted(self.scaffolds.items())),
            **rates,
        }


def format_summary(fig: dict[str, Any]) -> str:
    """Human-readable lines of :meth:`Summary.figures`."""
    lines = [
        f"samples in: {fig['samples_in']}  turns in: {fig['turns_in']}  "
        f"tokenized: {fig['tokenized']}  rejected (skipped): {fig['rejected']}",
        f"with reasoning: {fig['with_reasoning']} ({fig['with_reasoning_pct']}%)  "
        f"truncated: {fig['truncated']}",
        f"tokens: {fig['total_tokens']}  supervised: {fig['supervised_tokens']}  "
        f"avg seq len: {fig['avg_seq_len']}  avg response len: {fig['avg_response_len']}",
        f"unique tokens: {fig['unique_tokens']} (supervised: {fig['unique_supervised_tokens']})",
    ]
    if "elapsed_s" in fig:
        lines.append(f"elapsed: {fig['elapsed_s']:.1f}s   {fig['samples_per_s']:.2f} samples/s"
                     f"   {fig['tokens_per_s']:.1f} tokens/s")
    for reason, n in fig["rejected_by_reason"].items():
        lines.append(f"  rejected {reason}: {n}")
    return "\n".join(lines)
