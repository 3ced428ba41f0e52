"""The one launcher (engines/launcher.py) against small real Python children: ready by a file, by
HTTP, an early exit, a stall, a deadline, and the process group gone afterwards (grandchildren
too). No subprocess is mocked."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from specdraft.engines.launcher import (failure_message, file_ready, free_port, http_ready,
                                        launch, log_tail)
from specdraft.engines.process import EngineError

pytestmark = pytest.mark.timeout(120)


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie awaiting its reaper)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def wait_gone(*pids: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def child(tmp_path: Path, body: str, *, grandchild: bool = False,
          ignore_term: bool = False) -> list[str]:
    """``python -c`` running ``body``; first, optionally, SIGTERM ignored and a grandchild
    (``sleep 300``) started, its pid written to ``tmp_path/grandchild``, the child's own pid to
    ``tmp_path/child``."""
    head = "import os, sys, time, signal, subprocess\n"
    head += f"open({str(tmp_path / 'child')!r}, 'w').write(str(os.getpid()))\n"
    if ignore_term:
        head += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    if grandchild:
        head += ("g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
                 f"open({str(tmp_path / 'grandchild')!r}, 'w').write(str(g.pid))\n")
    return [sys.executable, "-c", head + body]


def pids(tmp_path: Path) -> list[int]:
    return [int((tmp_path / n).read_text()) for n in ("child", "grandchild")
            if (tmp_path / n).exists()]


def test_ready_by_file_then_stopped_with_its_group(tmp_path):
    """Entered once the file exists (not before: the child writes it after 0.5 s); leaving the
    block stops the child, which ignores SIGTERM, and its grandchild."""
    flag = tmp_path / "ready"
    cmd = child(tmp_path, f"time.sleep(0.5); open({str(flag)!r}, 'w').write('x')\n"
                "time.sleep(300)\n", grandchild=True, ignore_term=True)
    t0 = time.monotonic()
    with launch(cmd, tmp_path / "log", name="the test engine", ready=file_ready(flag),
                startup_s=30, grace_s=1) as engine:
        assert flag.exists() and time.monotonic() - t0 >= 0.5
        assert engine.poll() is None
        child_pid, grand = pids(tmp_path)
        assert engine.pid == child_pid and os.getpgid(grand) == engine.pid  # its own group
    assert wait_gone(child_pid, grand)


def test_ready_by_http(tmp_path):
    """A tiny http.server child answers /health 200 after 0.5 s; nothing answers before it
    starts, and the block is entered only once it does."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ready = http_ready(url)
    assert not ready()  # nothing listens yet
    server = (
        "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
        "class H(BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200 if self.path == '/health' else 404)\n"
        "        self.end_headers()\n"
        "time.sleep(0.5)\n"
        f"HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    with launch(child(tmp_path, server), tmp_path / "log", name="the test server", ready=ready,
                startup_s=30, poll_s=0.1) as engine:
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/other").status_code == 404
        pid = engine.pid
    assert wait_gone(pid)
    assert not ready()


def test_exit_before_ready_is_an_error_with_the_log_tail(tmp_path):
    """20 lines then the engine's own error and exit 3: the message is the headline with that
    error and the log's path, then the last 15 lines (line 6 on), in one format."""
    log = tmp_path / "engine.log"
    body = ("for i in range(20): print(f'line {i}')\n"
            "print('ValueError: max_model_len 16 is too small', flush=True)\nsys.exit(3)\n")
    with pytest.raises(EngineError) as err:
        with launch(child(tmp_path, body), log, name="the test engine",
                    ready=file_ready(tmp_path / "never"), startup_s=30):
            pytest.fail("entered without being ready")
    msg = str(err.value).splitlines()
    assert msg[0] == ("the test engine exited with status 3 before it was ready: ValueError: "
                      f"max_model_len 16 is too small (full log: {log})")
    assert msg[1:] == [f"  | line {i}" for i in range(6, 20)] + [
        "  | ValueError: max_model_len 16 is too small"]


def test_alive_without_progress_is_stopped_after_the_timeout(tmp_path):
    """A child that prints once, starts a grandchild and then hangs silently: EngineError after
    the no-progress timeout (not before, not much after), naming the flag; the child (which
    ignores SIGTERM) and its grandchild are gone afterwards."""
    cmd = child(tmp_path, "print('loading', flush=True)\ntime.sleep(300)\n", grandchild=True,
                ignore_term=True)
    t0 = time.monotonic()
    with pytest.raises(EngineError) as err:
        with launch(cmd, tmp_path / "log", name="the test engine", no_progress_s=1.5,
                    timeout_flag="--engine-no-progress-s", grace_s=1) as engine:
            engine.wait()
    took = time.monotonic() - t0
    assert 1.5 <= took < 10, took
    assert str(err.value).startswith(
        "the test engine made no progress for 1.5 s (its log and outputs did not change; raise "
        "--engine-no-progress-s if it needs longer); stopped: loading")
    assert wait_gone(*pids(tmp_path)) and len(pids(tmp_path)) == 2


@pytest.mark.parametrize("via", ["log", "output", "probe"])
def test_progress_resets_the_timer(tmp_path, via):
    """A child busy for 3 s with a no-progress timeout of 1 s is not stopped while it moves its
    log, a named output file, or a caller's probe (a counter file it rewrites) every 0.2 s; it
    exits 0 on its own."""
    out = tmp_path / "out.bin"
    step = {"log": "print(i, flush=True)",
            "output": f"open({str(out)!r}, 'ab').write(b'x')",
            "probe": f"open({str(out)!r}, 'w').write(str(i))"}[via]
    body = f"for i in range(15):\n    {step}\n    time.sleep(0.2)\n"
    progress = {"log": [], "output": [out],
                "probe": [lambda: out.read_text() if out.exists() else None]}[via]
    with launch(child(tmp_path, body), tmp_path / "log", name="the test engine",
                no_progress_s=1.0, progress=progress) as engine:
        assert engine.wait() == 0
    assert time.monotonic() - engine.started >= 2.9


def test_deadline_and_a_missing_python(tmp_path):
    with pytest.raises(EngineError, match="ran past 1 s"):
        with launch(child(tmp_path, "while True: print('busy', flush=True); time.sleep(0.1)"),
                    tmp_path / "log", name="the test engine", deadline_s=1) as engine:
            engine.wait()
    assert wait_gone(*pids(tmp_path))
    with pytest.raises(EngineError, match="the test engine: cannot start /no/such/python"):
        with launch(["/no/such/python"], tmp_path / "log2", name="the test engine"):
            pass


def test_stop_on_an_exception_in_the_block(tmp_path):
    """Whatever leaves the block (here a KeyboardInterrupt) stops the whole group."""
    cmd = child(tmp_path, "time.sleep(300)\n", grandchild=True)
    with pytest.raises(KeyboardInterrupt):
        with launch(cmd, tmp_path / "log", name="the test engine", grace_s=1):
            while len(pids(tmp_path)) < 2:
                time.sleep(0.05)
            raise KeyboardInterrupt
    assert len(pids(tmp_path)) == 2 and wait_gone(*pids(tmp_path))


def test_failure_message_and_tail_by_hand(tmp_path):
    """The one format: the last exception line (behind a rank prefix), a known cause said
    first, progress-bar carriage returns collapsed to what was shown last, blank lines left
    out."""
    log = tmp_path / "engine.log"
    log.write_text("INFO start\nLoading 10%\rLoading 100%\n\n[rank0]: Traceback (most recent "
                   "call last):\n[rank0]: RuntimeError: Could not uniquely identify the group\n"
                   "INFO shutting down\n")
    assert log_tail(log, 3) == ["[rank0]: Traceback (most recent call last):",
                                "[rank0]: RuntimeError: Could not uniquely identify the group",
                                "INFO shutting down"]
    assert log_tail(log)[1] == "Loading 100%"
    msg = failure_message("the vLLM engine", "exited with status 1", log, lines=2,
                          causes={"uniquely identify": "use --backend transformers"})
    assert msg == ("use --backend transformers (the vLLM engine exited with status 1: "
                   "RuntimeError: Could not uniquely identify the group; full log: "
                   f"{log})\n  | [rank0]: RuntimeError: Could not uniquely identify the group\n"
                   "  | INFO shutting down")
    assert failure_message("x", "exited", tmp_path / "none") == (
        f"x exited: no output (full log: {tmp_path / 'none'})")
