"""Atomic file and directory writes: nothing half-written is ever visible under its final name.

Every artifact is written to a temporary sibling (``NAME.tmp-<pid>``), flushed and fsynced, then
moved into place with :func:`os.replace`, which is atomic on POSIX file systems.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import IO, Any, Iterator


def tmp_name(path: Path) -> Path:
    """The temporary sibling used while ``path`` is being written."""
    return path.with_name(f"{path.name}.tmp-{os.getpid()}")


def fsync_dir(path: Path) -> None:
    """fsync a directory so that a rename inside it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Open ``path`` for writing through a temp file that replaces it only on success.

    On an exception the temp file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
            with named_os_error(path):
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        with named_os_error(path):
            fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def named_os_error(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise an :class:`OSError` without a file name (a failed write, flush or fsync: disk
    full, I/O error) with ``path`` as its file name, errno kept, so the message names it."""
    try:
        yield
    except OSError as err:
        if err.filename is None and err.errno is not None:
            raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(path)) from err
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory that is renamed to ``path`` on success.

    An existing ``path`` is replaced (moved aside, then deleted) only after the new one is
    complete; on an exception the temporary directory is deleted.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        old = path.with_name(f"{path.name}.old-{os.getpid()}")
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        fsync_dir(path.parent)
        if old.exists():
            shutil.rmtree(old)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def atomic_save_safetensors(tensors: dict[str, Any], path: str | os.PathLike,
                            metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` (name → contiguous CPU :class:`torch.Tensor`) to the safetensors file
    ``path`` atomically and durably (fsynced file and directory).

    The file is written inside a private staging directory, ``tmp_name(path)``, then renamed into
    place. The directory matters: safetensors ≥ 0.7 itself writes through a temp file
    (``.tmpXXXXXX``) next to its target, which a ``kill -9`` leaves behind under a name no
    cleanup here could attribute to a writer; inside the staging directory it is removed with the
    directory by whoever cleans up ``*.tmp-*`` (:func:`remove_stale_tmp`, the extract writer).

    Raises:
        OSError: the write, fsync or rename failed, with ``path`` as its file name.
    """
    from safetensors.torch import save_file

    path = Path(path)
    staging = tmp_name(path)
    if staging.exists():
        shutil.rmtree(staging) if staging.is_dir() else staging.unlink()
    staging.mkdir(parents=True)
    try:
        inner = staging / path.name
        with named_os_error(path):
            save_file(tensors, str(inner), metadata=metadata)
            with open(inner, "rb") as f:
                os.fsync(f.fileno())
            os.replace(inner, path)
            fsync_dir(path.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def remove_stale_tmp(directory: str | os.PathLike) -> list[Path]:
    """Delete leftovers of interrupted atomic writes (``*.tmp-*``) in ``directory``; return them."""
    directory = Path(directory)
    if not directory.exists():
        return []
    stale = [p for p in directory.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    for p in stale:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return stale
