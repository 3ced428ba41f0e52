"""kill -9 tests: start a command, SIGKILL it once its output shows it is mid-work."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Callable


def kill9_when(cmd: list[str], ready: Callable[[], bool], *, timeout_s: float = 300,
               env: dict[str, str] | None = None) -> None:
    """Run ``cmd``; as soon as ``ready()`` is true, SIGKILL it (no cleanup runs).

    Fails the test when the command exits before ``ready()`` (nothing was interrupted) or when
    ``ready()`` stays false for ``timeout_s`` seconds.
    """
    env = env or {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    try:
        while not ready():
            assert proc.poll() is None, f"{cmd[:4]}… finished before it could be killed"
            assert time.monotonic() < deadline, f"{cmd[:4]}… never became ready to kill"
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
