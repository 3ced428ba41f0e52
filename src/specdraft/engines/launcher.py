"""The one way specdraft runs an outside process (an engine, its worker, a server): start it in
a process group of its own with its output in one log file, wait until it is ready, watch it
make progress, and stop the whole group however the caller leaves (STYLE §14).

:func:`launch` is the entry; it yields an :class:`Engine`, the running process:

- ready: an optional predicate (:func:`file_ready`, :func:`http_ready`, or any callable) that
  must hold within ``startup_s``; an exit before it is an :class:`EngineError`;
- progress: the log growing, a named output changing (a file's size or mtime, a directory's
  listing) or a caller's probe returning a new value; no progress for ``no_progress_s`` is an
  :class:`EngineError` naming ``timeout_flag`` (the setting the user raises);
- ``deadline_s``: the most wall-clock seconds the process may live at all (a batch job's cap);
- every error carries one account of the log (:func:`failure_message`): a headline with the
  engine's own last error line and the log's path, then its last lines;
- on leaving the ``with`` block (normally, on an error, on Ctrl-C) the process group gets
  SIGTERM, then SIGKILL (:func:`specdraft.engines.process.stop`), so no grandchild outlives it.

Nothing here imports an engine; the workers themselves run in the engine's interpreter
(:mod:`specdraft.engines.worker`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence, Union

from specdraft.engines.process import EngineError, stop

#: Lines of the log an error shows.
TAIL_LINES = 15
#: What counts as progress: a path (file: size and mtime; directory: its listing) or a probe.
Progress = Union[str, os.PathLike, Callable[[], Hashable]]


def log_tail(log: str | os.PathLike, lines: int | None = TAIL_LINES) -> list[str]:
    """The last ``lines`` (None: all) non-empty lines of ``log``, as shown (a progress bar's
    carriage-return rewrites collapsed to the last); ``[]`` when it does not exist."""
    path = Path(log)
    if not path.exists():
        return []
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    rows = [ln.rsplit("\r", 1)[-1].rstrip() for ln in text.split("\n")]
    rows = [ln for ln in rows if ln.strip()]
    return rows if lines is None else rows[-lines:]


def last_error_line(lines: Sequence[str]) -> str:
    """The engine's own last exception line among ``lines`` (``ValueError: ...``, also behind a
    ``[rank0]: `` prefix), else the last line, else ``"no output"``."""
    errors = [ln.split("]: ")[-1].strip() for ln in lines
              if "Error" in ln.split(":")[0] or "Exception" in ln.split(":")[0]
              or ln.split("]: ")[-1].split(":")[0].endswith(("Error", "Exception"))]
    return errors[-1] if errors else (lines[-1].strip() if lines else "no output")


def failure_message(name: str, what: str, log: str | os.PathLike, *,
                    causes: Mapping[str, str] | None = None, lines: int = TAIL_LINES) -> str:
    """The one account of a failed process: ``"{name} {what}: {its last error line} (full log:
    LOG)"`` (the last exception line anywhere in the log), then its last ``lines`` log lines,
    each as ``"\n  | LINE"``. ``causes``: ``{sign: cause}``; when the
    last error line holds a ``sign``, that cause is said first, the engine's line kept in
    parentheses (a cause the user can act on, e.g. "use --backend transformers")."""
    every = log_tail(log, None)
    last, tail = last_error_line(every), every[-lines:]
    head = f"{name} {what}: {last}"
    cause = next((c for sign, c in (causes or {}).items() if sign in last), None)
    head = f"{cause} ({head}; full log: {log})" if cause else f"{head} (full log: {log})"
    return head + "".join(f"\n  | {ln}" for ln in tail)


def file_ready(path: str | os.PathLike) -> Callable[[], bool]:
    """Ready when ``path`` exists (a worker's output, a port file)."""
    return Path(path).exists


def http_ready(url: str, paths: Sequence[str] = ("/health",), *,
               timeout_s: float = 2.0) -> Callable[[], bool]:
    """Ready when a GET of ``url`` + any of ``paths`` answers 200 (a server's health route:
    vLLM's and SGLang's ``/health``; SGLang's ``/get_model_info``)."""
    def ready() -> bool:
        import httpx

        for path in paths:
            try:
                if httpx.get(url + path, timeout=timeout_s).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
        return False
    return ready


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server this process starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _signature(item: Progress) -> Hashable:
    if callable(item):
        return item()
    path = Path(item)
    try:
        if path.is_dir():
            return tuple(sorted(os.listdir(path)))
        st = path.stat()
        return st.st_size, st.st_mtime_ns
    except OSError:
        return None


class Engine:
    """A process started by :func:`launch`: its ``proc`` (``subprocess.Popen``), ``log`` path and
    ``name`` (said in every error), and the watch over it (see :func:`launch`)."""

    def __init__(self, proc: subprocess.Popen, log: Path, name: str, *,
                 no_progress_s: float | None, deadline_s: float | None,
                 progress: Sequence[Progress], timeout_flag: str | None,
                 causes: Mapping[str, str] | None, poll_s: float) -> None:
        self.proc, self.log, self.name = proc, log, name
        self.no_progress_s, self.deadline_s = no_progress_s, deadline_s
        self.timeout_flag, self.causes, self.poll_s = timeout_flag, causes, poll_s
        self._progress = [log, *progress]
        self.started = time.monotonic()
        self._seen = self._signatures()
        self.last_progress = self.started

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return self.proc.poll()

    def _signatures(self) -> list[Hashable]:
        return [_signature(p) for p in self._progress]

    def error(self, what: str) -> EngineError:
        """An :class:`EngineError` ``"{name} {what}: ..."`` with the log
        (:func:`failure_message`)."""
        return EngineError(failure_message(self.name, what, self.log, causes=self.causes))

    def exited_error(self, rc: int | None = None) -> EngineError:
        """The error for an exit: ``"{name} exited with status {rc}: {last error line} ..."``."""
        rc = self.proc.returncode if rc is None else rc
        return self.error(f"exited with status {rc}")

    def check(self) -> None:
        """Raise :class:`EngineError` when the process ran past ``deadline_s`` or made no
        progress (log, outputs, probes) for ``no_progress_s``; otherwise note any progress.
        An exit is not an error here: what it means is the caller's (see :meth:`wait`)."""
        now = time.monotonic()
        seen = self._signatures()
        if seen != self._seen:
            self._seen, self.last_progress = seen, now
        if self.deadline_s is not None and now - self.started > self.deadline_s:
            raise self.error(f"ran past {self.deadline_s:.0f} s"
                             + (f" (raise {self.timeout_flag})" if self.timeout_flag else ""))
        if self.no_progress_s is not None and now - self.last_progress > self.no_progress_s:
            flag = f"; raise {self.timeout_flag} if it needs longer" if self.timeout_flag else ""
            raise self.error(f"made no progress for {self.no_progress_s:g} s (its log and "
                             f"outputs did not change{flag}); stopped")

    def wait_until(self, predicate: Callable[[], Any], *, timeout_s: float | None = None,
                   what: str = "was ready") -> None:
        """Return once ``predicate()`` is true; :meth:`check` meanwhile. Raises
        :class:`EngineError` when the process exits first (``"exited with status N before it
        {what}"``) or ``timeout_s`` passes (``"did not come up in N s"``)."""
        t0 = time.monotonic()
        while not predicate():
            rc = self.proc.poll()
            if rc is not None:
                if predicate():  # the last thing it did before exiting
                    return
                raise self.error(f"exited with status {rc} before it {what}")
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise self.error(f"did not come up in {timeout_s:.0f} s")
            self.check()
            time.sleep(self.poll_s)

    def wait(self) -> int:
        """Block until the process exits, :meth:`check` meanwhile; its exit status."""
        while self.proc.poll() is None:
            self.check()
            time.sleep(self.poll_s)
        return self.proc.returncode

    def stop(self, grace_s: float = 15) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``grace_s`` seconds."""
        stop(self.proc, grace_s)


@contextlib.contextmanager
def launch(cmd: Sequence[str], log: str | os.PathLike, *, name: str,
           env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
           ready: Callable[[], Any] | None = None, startup_s: float | None = None,
           no_progress_s: float | None = None, deadline_s: float | None = None,
           progress: Sequence[Progress] = (), timeout_flag: str | None = None,
           causes: Mapping[str, str] | None = None, poll_s: float = 0.05,
           grace_s: float = 15) -> Iterator[Engine]:
    """Start ``cmd`` and yield its :class:`Engine`; stop its process group on leaving.

    ``cmd`` runs in a new session (its own process group, so :meth:`Engine.stop` reaches every
    process it spawns), stdin closed, stdout and stderr into ``log`` (truncated). ``env``: its
    whole environment (None: this process's). With ``ready``, the block is entered only once
    ``ready()`` holds (:meth:`Engine.wait_until`, within ``startup_s`` seconds). The watch
    (:meth:`Engine.check`, run while waiting): ``no_progress_s`` without the log, a path in
    ``progress`` or a probe in ``progress`` changing, or ``deadline_s`` in all, is an
    :class:`EngineError` that names ``timeout_flag``. ``causes``: see :func:`failure_message`.

    Raises :class:`EngineError` when ``cmd`` cannot be started (its python missing), exits
    before it is ready, or times out; every message carries the log's last lines.
    """
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=dict(env) if env is not None
                                    else None, cwd=cwd, start_new_session=True)
        except OSError as err:
            raise EngineError(f"{name}: cannot start {cmd[0]}: {err.strerror or err}") from None
    engine = Engine(proc, log, name, no_progress_s=no_progress_s, deadline_s=deadline_s,
                    progress=progress, timeout_flag=timeout_flag, causes=causes, poll_s=poll_s)
    try:
        if ready is not None:
            engine.wait_until(ready, timeout_s=startup_s)
        yield engine
    finally:
        engine.stop(grace_s)
