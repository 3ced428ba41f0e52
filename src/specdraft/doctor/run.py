"""``specdraft doctor``: run every check of :mod:`specdraft.artifacts.checks`; read-only."""

from __future__ import annotations

from typing import Any

from specdraft.artifacts.checks import check_drafter
from specdraft.core.context import StageContext, single_process
from specdraft.doctor.config import DoctorConfig


def run(config: DoctorConfig, ctx: StageContext | None = None, *,
        verifier: Any | None = None) -> dict[str, Any]:
    """``{"drafter", "format", "ok", "checks": [{name, ok, detail, fix}]}``; writes nothing.

    ``verifier``: an already loaded verifier (else ``config.verifier`` is loaded in
    ``config.dtype``).

    ``ctx``: this process (:mod:`specdraft.core.context`), else read from the environment; the
    stage runs in one process (:func:`specdraft.core.context.single_process`)."""
    single_process("doctor", ctx, "cpu")
    return check_drafter(config.target, config.verifier, verifier=verifier, dtype=config.dtype)
