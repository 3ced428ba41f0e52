"""Durable JSONL: batched, flushed and fsynced appends; torn-tail repair; line-numbered reads
(plain, gzip ``.gz`` or zstandard ``.zst``)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

from specdraft.core.atomic import named_os_error
from specdraft.core.errors import InputError

MAX_DEPTH = 256
"""Deepest nesting of arrays/objects a user file may hold. Chat records and configs nest a few
levels (tool schemas a few dozen); deeper values are refused at the reader, so that no later
``json.dumps``, copy or template render can hit Python's recursion limit."""


def parse_json(text: str | bytes) -> Any:
    """``json.loads(text)``, total: every failure is a :class:`ValueError` with a short message.

    ``json.loads`` raises :class:`RecursionError` (not a ValueError) for deep nesting
    (``"[" * 100000``) and :class:`ValueError` for integers past Python's digit limit; values
    nested deeper than :data:`MAX_DEPTH` are refused too.
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply for the JSON parser") from None
    problem = shape_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def shape_problem(value: Any, *, max_depth: int = MAX_DEPTH,
                  max_nodes: int | None = None) -> str | None:
    """Why ``value`` is too deep (lists/dicts nested past ``max_depth``) or too big (more than
    ``max_nodes`` values, counting each reference: YAML aliases can expand a small file into
    billions), or None. Iterative, so a cyclic YAML value ends at the depth limit."""
    stack, seen = [(value, 1)], 0
    while stack:
        v, depth = stack.pop()
        seen += 1
        if max_nodes is not None and seen > max_nodes:
            return f"more than {max_nodes} values (aliases expanding?)"
        if isinstance(v, dict):
            v = list(v.values())
        elif not isinstance(v, list):
            continue
        if depth > max_depth:
            return f"nested deeper than {max_depth} levels"
        stack.extend((x, depth + 1) for x in v)
    return None


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
                parse_json(data[start:])
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
            with named_os_error(self.path):
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


def decode_line(raw: bytes, path: str | os.PathLike, lineno: int) -> str:
    """``raw`` as UTF-8 (a BOM on line 1 is dropped); :class:`InputError` naming ``path:line``
    and the byte column when it is not UTF-8."""
    if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}:{lineno}: not UTF-8 (byte 0x{raw[err.start]:02x} at column "
                         f"{err.start + 1}); re-encode the file as UTF-8") from None


#: Compressed file suffixes read transparently, and what decompresses them.
COMPRESSED = (".gz", ".zst")


def open_binary(path: str | os.PathLike) -> io.BufferedIOBase:
    """``path`` opened for binary reading, decompressed on the fly when its name ends in ``.gz``
    (gzip, stdlib) or ``.zst`` (zstandard, the ``zstandard`` package), else as is.

    Raises :class:`InputError` naming ``path`` when it cannot be opened.
    """
    try:
        f = open(path, "rb")
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror})") from None
    suffix = Path(path).suffix.lower()
    if suffix == ".gz":
        import gzip

        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    if suffix == ".zst":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(f, closefd=True)
        return io.BufferedReader(reader)  # type: ignore[arg-type]
    return f


def _compressed_lines(f: io.BufferedIOBase, path: str | os.PathLike) -> Iterator[bytes]:
    """The lines of ``f``; a corrupt or truncated compressed stream is an :class:`InputError`
    naming ``path`` (gzip raises ``OSError``/``EOFError``, zstandard ``ZstdError``)."""
    it = iter(f)
    while True:
        try:
            raw = next(it)
        except StopIteration:
            return
        except Exception as err:  # gzip: OSError/EOFError; zstandard.ZstdError: Exception
            raise InputError(f"{path}: not a readable compressed file "
                             f"({type(err).__name__}: {_short(err)})") from None
        yield raw


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, record)``; blank lines are skipped, a UTF-8 BOM and CRLF line ends
    are accepted; ``.gz``/``.zst`` files are decompressed on the fly (:func:`open_binary`).

    Raises :class:`InputError` naming ``path:line`` for a line that is not UTF-8 or not a JSON
    object, and naming ``path`` when it cannot be opened or decompressed.
    """
    f = open_binary(path)
    with f:
        for lineno, raw in enumerate(_compressed_lines(f, path), 1):
            line = decode_line(raw, path, lineno)
            if not line.strip():
                continue
            try:
                record = parse_json(line)
            except ValueError as err:
                raise InputError(f"{path}:{lineno}: not valid JSON ({_short(err)})") from None
            if not isinstance(record, dict):
                raise InputError(f"{path}:{lineno}: expected a JSON object, got "
                                 f"{type(record).__name__}")
            yield lineno, record


def read_json(path: str | os.PathLike, *, what: str = "JSON file") -> Any:
    """The JSON value in ``path`` (UTF-8, BOM accepted).

    Raises :class:`InputError` naming the file, line and column when it cannot be read, is not
    UTF-8 or is not valid JSON; ``what`` says which file it is (e.g. ``"drafter config.json"``).
    """
    try:
        if Path(path).suffix.lower() in COMPRESSED:
            with open_binary(path) as f:
                data = b"".join(_compressed_lines(f, path))
        else:
            data = Path(path).read_bytes()
    except OSError as err:
        raise InputError(f"{path}: {what} cannot be read ({err.strerror})") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(f"{path}:{line}: {what} is not UTF-8 (byte 0x{data[err.start]:02x})"
                         ) from None
    try:
        return parse_json(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: {what} is not valid JSON ({err.msg} at column "
                         f"{err.colno})") from None
    except ValueError as err:
        raise InputError(f"{path}: {what} is not valid JSON ({_short(err)})") from None


def read_model(path: str | os.PathLike, model: Any, *, what: str) -> Any:
    """``path``'s JSON validated into the pydantic class ``model``.

    Raises :class:`InputError` naming the file: unreadable or invalid JSON (:func:`read_json`),
    or ``not a readable {what}`` with the first validation errors."""
    data = read_json(path, what=what)
    try:
        return model.model_validate(data)
    except ValueError as err:
        raise InputError(f"{path}: not a readable {what} "
                         f"({' '.join(str(err).split())[:300]})") from None


def _short(err: Exception) -> str:
    """A JSON error message without a huge echo of the input."""
    msg = str(err)
    return msg if len(msg) <= 200 else msg[:200] + "…"
