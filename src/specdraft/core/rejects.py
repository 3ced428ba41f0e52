"""Rejects: every dropped sample is counted and written to ``rejects.jsonl`` with its reason."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from specdraft.core.errors import InputError
from specdraft.core.jsonl import JsonlWriter


class Rejects:
    """Appends ``{"id", "reason", "detail", ...}`` lines to ``STAGE/rejects.jsonl`` and counts
    reasons. Call :meth:`flush` at the points where outputs are flushed, :meth:`close` at the end.
    """

    def __init__(self, stage_dir: str | Path, filename: str = "rejects.jsonl") -> None:
        self.path = Path(stage_dir) / filename
        self.counts: Counter[str] = Counter()
        self._pending: list[dict[str, Any]] = []
        self._writer = JsonlWriter(self.path)

    def add(self, sample_id: str, reason: str, detail: str = "", **fields: Any) -> None:
        self.counts[reason] += 1
        self._pending.append({"id": sample_id, "reason": reason, "detail": detail, **fields})

    @property
    def pending(self) -> list[dict[str, Any]]:
        """The reject records not yet flushed, oldest first."""
        return list(self._pending)

    def discard(self) -> None:
        """Forget the rejects not yet flushed (a run refused before any work keeps no file)."""
        for rec in self._pending:
            self.counts[rec["reason"]] -= 1
        self.counts = +self.counts
        self._pending.clear()

    def flush(self) -> None:
        self._writer.write_batch(self._pending)
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        self._writer.close()

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def check_reject_fraction(rejected: Counter[str] | dict[str, int], total: int, limit: float,
                          *, details: str, what: str = "input rows") -> None:
    """Raise :class:`InputError` with the counts when more than ``limit`` of ``total`` units of
    input (``what``) were rejected (``--max-reject-fraction``): the input is mostly wrong, and
    running on would spend the verifier's time on what is left, or train on a sliver of it.
    ``details`` says where the rejects are and what to do."""
    n = sum(rejected.values())
    if total and n / total > limit:
        raise InputError(
            f"{n} of {total} {what} rejected ({n / total:.0%}, more than "
            f"--max-reject-fraction {limit}): {dict(sorted(rejected.items()))}; {details}")
