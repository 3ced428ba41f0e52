"""Shared by the live-server tests (``test_live_*.py``): the server settings they use, one way
to start a real ``specdraft serve`` under the engine environment."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "extract"))
from vllm_helpers import engine_env  # noqa: E402

AUX = (1, 2, 3)


def serve_config(run_dir: Path, verifier: Path, **extra: Any) -> Any:
    """``ServeConfig`` of a tiny verifier: aux ids :data:`AUX`, a free port, float32, eager,
    256-token context, 8 sequences."""
    from specdraft.engines.launcher import free_port
    from specdraft.engines.live_config import ServeConfig

    return ServeConfig(**{**dict(run_dir=run_dir, verifier=str(verifier), aux_layers=AUX,
                                 port=free_port(), dtype="float32", max_model_len=256,
                                 extra_args="--enforce-eager --max-num-seqs 8",
                                 startup_s=600), **extra})


@contextlib.contextmanager
def served(*configs: Any) -> Iterator[list[tuple[str, list[str], Any]]]:
    """Start each config's server (:func:`specdraft.engines.live.start`, one after the other)
    with the engine environment (:func:`vllm_helpers.engine_env`); yields ``[(url, command,
    process)]``; every server's group is stopped on leaving."""
    from specdraft.engines.live import start

    with pytest.MonkeyPatch.context() as mp, contextlib.ExitStack() as stack:
        for k, v in engine_env().items():
            mp.setenv(k, v)
        yield [stack.enter_context(start(c)) for c in configs]
