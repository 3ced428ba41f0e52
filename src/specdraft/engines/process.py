"""Engine subprocesses: one error type and one way to stop them.

Every engine process (eval's vLLM worker and SGLang server, extract's vLLM worker) is started
by :func:`specdraft.engines.launcher.launch` in a session of its own (``start_new_session=True``),
so that :func:`stop` reaches every process the engine spawned (vLLM starts workers of its own).
"""

from __future__ import annotations

import os
import signal
import subprocess

from specdraft.core.errors import SpecdraftError


class EngineError(SpecdraftError, RuntimeError):
    """The engine subprocess failed or could not be started; the message carries the engine's
    own last error lines and the path of its log."""


def stop(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """Stop ``proc``'s whole process group: SIGTERM, up to ``grace_s`` seconds for it to exit,
    then SIGKILL for whatever of the group is left. A no-op for a group already gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
