"""Rejects: every dropped sample is counted and written to ``rejects.jsonl`` with its reason."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

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

    def flush(self) -> None:
        self._writer.write_batch(self._pending)
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        self._writer.close()

    @property
    def total(self) -> int:
        return sum(self.counts.values())
