"""Progress of a long stage, one way for every stage (generate, extract, train, eval).

On a terminal: a ``tqdm`` bar. Anywhere else (a log file, a pipe, CI): one plain line per
update, at most one every ``interval_s`` seconds, never a carriage return, e.g.
``extract: 12,345/40,821 tokens (30%), 205.8 tokens/s, elapsed 1m00s, ETA 2m18s; samples 72,
written 4.0 MiB``. A heartbeat thread makes a line (or a bar refresh) come at least every
``interval_s`` even while one unit of work (a batch of generation, a training step, an engine
start) runs far longer, so a log never goes quiet for more than that.

The counts are what the caller says they are: each stage counts its real units (unpadded
tokens, bytes of files written, finished samples, optimizer steps, decoded prompts).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, TextIO

#: Seconds between two progress lines (issue #40: at least every 30 s in every stage).
INTERVAL_S = 30.0
#: What turns the Hugging Face libraries' own bars off (they draw with carriage returns).
HF_BAR_SWITCHES = ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")


def is_tty(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (a bar may be drawn on it)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def quiet_library_bars(stream: Any = None) -> None:
    """When ``stream`` (default stderr) is no terminal, turn off the bars transformers,
    datasets and huggingface_hub draw (``\\r``-redrawn lines that a log keeps as one endless
    line), by their own environment switches (:data:`HF_BAR_SWITCHES`, read when those
    libraries are imported; a value the user set is kept). Called once by the CLI entry."""
    if not is_tty(sys.stderr if stream is None else stream):
        for name in HF_BAR_SWITCHES:
            os.environ.setdefault(name, "1")


def human_seconds(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: a duration for a progress line."""
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.1f}"


class StageProgress:
    """Counts a stage's units and shows them: a ``tqdm`` bar on a terminal, lines otherwise.

    ``desc``: the stage (each line starts ``desc:``); ``total``: units to do (None: unknown);
    ``unit``: their name, plural (``tokens``, ``steps``); ``render``: a function of the elapsed
    seconds giving the whole line instead of the default one (generate keeps its own line);
    ``clock``: seconds (``time.monotonic``; a fake in tests); ``tty``: force the mode (None:
    :func:`is_tty` of ``stream``); ``enabled``: False makes every call a no-op (ranks other
    than 0). Use as a context manager: the heartbeat thread runs inside it, and leaving it
    prints the final line (counts as they end). Thread-safe: the heartbeat and the stage's
    own thread both call :meth:`tick`.
    """

    def __init__(self, desc: str, *, total: float | None = None, unit: str = "it",
                 stream: TextIO | None = None, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, tty: bool | None = None,
                 render: Callable[[float], str] | None = None, enabled: bool = True,
                 initial: float = 0) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s, self.clock, self.render = interval_s, clock, render
        self.enabled = enabled
        self.tty = is_tty(self.stream) if tty is None else tty
        self.n, self.initial = initial, initial
        self.postfix: dict[str, Any] = {}
        self.t0 = clock()
        self._last = self.t0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None
        if enabled and self.tty:
            self._open_bar()

    # ------------------------------------------------------------------ counting
    def update(self, n: float = 0, *, emit: bool = True, **postfix: Any) -> None:
        """Add ``n`` units done and set the ``postfix`` fields (``written="4.0 MiB"``); print
        a line when one is due (``emit=False``: count only, e.g. the first samples of a batch
        that finished together; :meth:`tick` prints after its last)."""
        if not self.enabled:
            return
        with self._lock:
            self.n += n
            self.postfix.update(postfix)
            if self._bar is not None:
                if postfix:
                    self._bar.set_postfix(self.postfix, refresh=False)
                self._bar.update(n)
        if emit:
            self.tick()

    def set_total(self, total: float | None) -> None:
        """Change the units to do (on a terminal the bar is redrawn)."""
        with self._lock:
            self.total = total
            if self._bar is not None:
                self._bar.total = total
                self._bar.refresh()

    def tick(self) -> None:
        """Print the line (terminal: redraw the bar) when ``interval_s`` passed since the last."""
        if not self.enabled:
            return
        with self._lock:
            now = self.clock()
            if now - self._last < self.interval_s:
                return
            self._last = now
            if self._bar is not None:
                self._bar.refresh()
            else:
                self._print(self.line(now))

    def write(self, message: str) -> None:
        """Print ``message`` on a line of its own (above the bar on a terminal)."""
        if not self.enabled:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.write(message, file=self.stream)
            else:
                self._print(message)

    # ------------------------------------------------------------------ the line
    def line(self, now: float | None = None) -> str:
        """The progress line at ``now`` (default: the clock's now), without a newline."""
        elapsed = (self.clock() if now is None else now) - self.t0
        if self.render is not None:
            return self.render(elapsed)
        done = self.n - self.initial
        rate = done / elapsed if elapsed > 0 else 0.0
        text = f"{self.desc}: {_number(self.n)}"
        if self.total:
            text += f"/{_number(self.total)} {self.unit} ({100 * self.n / self.total:.0f}%)"
        else:
            text += f" {self.unit}"
        text += f", {rate:,.1f} {self.unit}/s, elapsed {human_seconds(elapsed)}"
        if self.total:
            left = self.total - self.n
            text += f", ETA {human_seconds(left / rate) if rate > 0 else '?'}"
        if self.postfix:
            text += "; " + ", ".join(f"{k} {v}" for k, v in self.postfix.items())
        return text

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def _open_bar(self) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=self.total, initial=self.initial, desc=self.desc,
                         unit=f" {self.unit}", unit_scale=True, file=self.stream,
                         dynamic_ncols=True)

    # ------------------------------------------------------------------ heartbeat, close
    def heartbeat(self, wait: Callable[[float], bool] | None = None) -> None:
        """The heartbeat loop: :meth:`tick` every ``poll`` seconds until :meth:`close`
        (``wait(seconds)`` returns True to stop; default: the close event's wait). Runs in
        the thread :meth:`__enter__` starts; a test calls it with a fake ``wait``."""
        wait = wait or self._stop.wait
        poll = min(1.0, self.interval_s / 4)
        while not wait(poll):
            self.tick()

    def start(self) -> "StageProgress":
        """Start the heartbeat thread (once); returns self."""
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self.heartbeat, daemon=True,
                                            name=f"progress-{self.desc}")
            self._thread.start()
        return self

    def __enter__(self) -> "StageProgress":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self, final: bool = True) -> None:
        """Stop the heartbeat; print the final line (``final``) or close the bar. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if not self.enabled:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            elif final and self._last is not None:
                self._print(self.line())
            self._last = None  # type: ignore[assignment]
            self.enabled = False
