"""One process per stage directory: an advisory lock file ``RUN/<stage>/.lock``.

The lock is a POSIX ``flock`` on the file (exclusive, non-blocking), taken by
:func:`specdraft.core.rundir.open_stage_dir` and held until the stage writes its manifest
(:func:`release`) or the process ends. The kernel drops an ``flock`` when its holder dies
(Ctrl-C, crash, kill -9), so the lock of a dead process never blocks: the next run takes it over
and rewrites the holder line. While held, the file names the holder (``pid``, ``host``,
``command``, ``started_at``) so that a refused second run says who is running.

The same process may take a lock it already holds (the pipeline runs a stage after the checks
that opened it; tests run stages repeatedly). ``flock`` is local to one machine: two hosts
sharing a run directory over NFS are not excluded (NFS emulates it with byte-range locks
since Linux 2.6.12, which does exclude; other network file systems may not).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from specdraft.core.errors import StageDirError

LOCK_FILE = ".lock"

_held: dict[Path, int] = {}  # resolved lock path -> open fd, for this process


def acquire(directory: str | os.PathLike, *, what: str, claim: bool = True) -> Path:
    """Take the lock of ``directory`` (created if missing) for this process; return its path.

    ``what`` names the command in the refusal (``"specdraft extract"``). ``claim``: write this
    process's holder line now; a caller that may still refuse the command takes the lock with
    ``claim=False`` and calls :func:`claim` once it goes on (a refused command leaves the file
    as it found it). Raises :class:`StageDirError` naming the running holder (pid, host,
    command, start time) when another live process holds it.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = (directory / LOCK_FILE).resolve()
    if path in _held:
        return path
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _describe(fd)
        os.close(fd)
        raise StageDirError(f"{directory} is in use by another `{what}`: {holder}; wait for it "
                            f"to finish or stop it (a killed process frees the lock)") from None
    if claim:
        _write_holder(fd)
    _held[path] = fd
    return path


def claim(directory: str | os.PathLike) -> None:
    """Write this process's holder line into the lock of ``directory`` it holds
    (:func:`acquire` with ``claim=False``)."""
    _write_holder(_held[(Path(directory) / LOCK_FILE).resolve()])


def release(directory: str | os.PathLike) -> None:
    """Drop this process's lock of ``directory`` (no-op when not held)."""
    path = (Path(directory) / LOCK_FILE).resolve()
    fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)  # closing the last descriptor releases the flock


def holds(directory: str | os.PathLike) -> bool:
    """True when this process holds the lock of ``directory``."""
    return (Path(directory) / LOCK_FILE).resolve() in _held


def _write_holder(fd: int) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "command": " ".join([os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]]),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    data = (json.dumps(info) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _describe(fd: int) -> str:
    """The holder line of a lock file, as ``pid P on HOST since T: COMMAND``."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "a process that has not yet written its name"
    return (f"pid {info.get('pid')} on {info.get('host')} since {info.get('started_at')}: "
            f"{info.get('command')}")
