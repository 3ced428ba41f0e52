"""``specdraft doctor``: run every check of :mod:`specdraft.artifacts.checks`; read-only."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specdraft.artifacts.checks import check_drafter
from specdraft.core.context import StageContext, single_process
from specdraft.doctor.config import DoctorConfig


@dataclass(frozen=True)
class DoctorReport:
    """The doctor's result: the drafter directory checked, its format, whether every check
    passed, and each check as ``{name, ok, detail, fix}``. ``report["ok"]`` reads like the dict
    ``run()`` returned before (:meth:`to_dict`). ``engine_fixes``: the CPU-engine fixes the
    run's eval figures needed (``RUN/eval/manifest.json`` ``engine.engine_fixes``; an entry
    starting ``OFF`` is a fix switched off), so that a patched engine is always said."""

    drafter: str
    format: str
    ok: bool
    checks: list[dict[str, Any]]
    engine_fixes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]


def run(config: DoctorConfig, ctx: StageContext | None = None, *,
        verifier: Any | None = None) -> DoctorReport:
    """Every check of :mod:`specdraft.artifacts.checks` on the drafter (:class:`DoctorReport`);
    writes nothing.

    ``verifier``: an already loaded verifier (else ``config.verifier`` is loaded in
    ``config.dtype``).

    ``ctx``: this process (:mod:`specdraft.core.context`), else read from the environment; the
    stage runs in one process (:func:`specdraft.core.context.single_process`)."""
    single_process("doctor", ctx, "cpu")
    return DoctorReport(**check_drafter(config.target, config.verifier, verifier=verifier,
                                        dtype=config.dtype),
                        engine_fixes=eval_engine_fixes(config.target))


def eval_engine_fixes(target: Any) -> list[str]:
    """The engine fixes recorded by the run's eval (``RUN/eval/manifest.json``
    ``engine.engine_fixes``); empty for a drafter directory or a run without engine figures."""
    from specdraft.artifacts.layout import RunLayout
    from specdraft.core.manifest import read_manifest

    layout = RunLayout(target)
    if not layout.is_run():
        return []
    manifest = read_manifest(layout.stage("eval")) or {}
    return [str(f) for f in ((manifest.get("engine") or {}).get("engine_fixes") or [])]
