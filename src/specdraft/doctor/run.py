"""``specdraft doctor``: run every check of :mod:`specdraft.artifacts.checks`; read-only."""

from __future__ import annotations

from typing import Any

from specdraft.artifacts.checks import check_drafter
from specdraft.doctor.config import DoctorConfig


def run(config: DoctorConfig, verifier: Any | None = None) -> dict[str, Any]:
    """``{"drafter", "format", "ok", "checks": [{name, ok, detail, fix}]}``; writes nothing.

    ``verifier``: an already loaded verifier (else ``config.verifier`` is loaded in
    ``config.dtype``)."""
    return check_drafter(config.target, config.verifier, verifier=verifier, dtype=config.dtype)
