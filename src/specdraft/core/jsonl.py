"""Durable JSONL: batched, flushed and fsynced appends; torn-tail repair; line-numbered reads."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

from specdraft.core.errors import InputError


def repair_torn_tail(path: str | os.PathLike) -> int:
    """Cut a torn last line (no trailing newline, or not valid JSON) left by a crash.

    Returns the number of bytes removed (0 when the file is intact or missing). Only the last
    line can be torn: appends are whole lines followed by fsync.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return 0
    with open(path, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            start = data.rfind(b"\n", 0, len(data) - 1) + 1
            try:
                json.loads(data[start:])
                return 0
            except ValueError:
                pass
        else:
            start = data.rfind(b"\n") + 1
        f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
    return len(data) - start


class JsonlWriter:
    """Append-only JSONL writer; each :meth:`write_batch` is flushed and fsynced before return."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")

    def write_batch(self, records: Iterable[dict[str, Any]]) -> int:
        """Append records as whole lines, then flush and fsync; return how many were written."""
        lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in records]
        if lines:
            self._f.write("".join(lines))
            self._f.flush()
            os.fsync(self._f.fileno())
        return len(lines)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, record)``; blank lines are skipped.

    Raises :class:`InputError` naming ``path:line`` for a line that is not a JSON object.
    """
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise InputError(f"{path}:{lineno}: not valid JSON ({err})") from None
            if not isinstance(record, dict):
                raise InputError(f"{path}:{lineno}: expected a JSON object, got "
                                 f"{type(record).__name__}")
            yield lineno, record
