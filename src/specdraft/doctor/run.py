"""``specdraft doctor``: run every check of :mod:`specdraft.doctor.checks`; read-only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdraft.core.errors import InputError
from specdraft.core.manifest import load_stage_manifest
from specdraft.doctor.checks import CHECKS, Subject
from specdraft.doctor.config import DoctorConfig
from specdraft.export.reader import read_drafter


def is_run_dir(path: Path) -> bool:
    return any((path / s / "manifest.json").exists() for s in ("train", "export", "extract"))


def drafter_path(target: Path) -> Path:
    """A run dir's latest export (RUN/export/manifest.json ``out``), else ``RUN/train/best``;
    any other directory is the drafter itself."""
    if not is_run_dir(target):
        return target
    export = load_stage_manifest(target / "export")
    if export is not None and Path(export.out).exists():
        return Path(export.out)
    if (target / "train" / "best").exists():
        return target / "train" / "best"
    raise InputError(f"{target}: a run directory with neither an export nor train/best")


def subject(config: DoctorConfig, verifier: Any | None = None) -> Subject:
    from specdraft.core.chat import run_chat_format
    from specdraft.core.verifier import load_tokenizer, load_verifier

    target = Path(config.target)
    run = target if is_run_dir(target) else None
    return Subject(
        drafter=read_drafter(drafter_path(target)),
        verifier=verifier if verifier is not None else load_verifier(config.verifier,
                                                                     dtype=config.dtype),
        tokenizer=load_tokenizer(config.verifier), run_dir=run,
        extract=load_stage_manifest(run / "extract") if run else None,
        prepare=load_stage_manifest(run / "prepare") if run else None,
        chat_format=run_chat_format(run), verifier_path=config.verifier)


def run(config: DoctorConfig, verifier: Any | None = None) -> dict[str, Any]:
    """``{"drafter", "format", "ok", "checks": [{name, ok, detail, fix}]}``; writes nothing."""
    s = subject(config, verifier)
    checks = [c(s).to_dict() for c in CHECKS]
    return {"drafter": str(s.drafter.path), "format": s.drafter.format,
            "ok": all(c["ok"] for c in checks), "checks": checks}
