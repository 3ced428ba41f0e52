"""The run directory contract.

Stage ``S`` writes only under ``RUN/S/`` and finishes by atomically writing
``RUN/S/manifest.json``; a stage is complete iff its manifest exists. Inputs of a stage are the
manifests of the stages before it (see :func:`require_stage`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from specdraft.core.atomic import remove_stale_tmp
from specdraft.core.errors import StageDirError
from specdraft.core.manifest import MANIFEST, Manifest, load_stage_manifest


def stage_dir(run_dir: str | Path, stage: str) -> Path:
    """``RUN/<stage>``."""
    return Path(run_dir) / stage


def open_stage_dir(run_dir: str | Path, stage: str, *, resume: bool = False,
                   overwrite: bool = False) -> Path:
    """Make ``RUN/<stage>`` ready for writing and return it.

    - empty or missing: created;
    - non-empty, neither flag: refused with :class:`StageDirError` (nothing is clobbered);
    - ``overwrite``: its content is deleted;
    - ``resume``: kept as is, except the manifest (the stage is being run again) and leftovers of
      interrupted atomic writes (``*.tmp-*``), which are removed.
    """
    if resume and overwrite:
        raise StageDirError("--resume and --overwrite exclude each other; pass one")
    path = stage_dir(run_dir, stage)
    if path.exists() and any(path.iterdir()):
        if overwrite:
            shutil.rmtree(path)
        elif resume:
            (path / MANIFEST).unlink(missing_ok=True)
            remove_stale_tmp(path)
        else:
            state = "complete" if (path / MANIFEST).exists() else "partial"
            raise StageDirError(
                f"{path} already holds {state} output of `specdraft {stage}`; pass --resume to "
                f"continue it or --overwrite to delete it and start over")
    path.mkdir(parents=True, exist_ok=True)
    return path


def require_stage(run_dir: str | Path, stage: str) -> Manifest:
    """The typed manifest (:data:`specdraft.core.manifest.MANIFEST_TYPES`) of the completed
    upstream ``stage``, or a :class:`StageDirError` saying which command to run first (an
    :class:`InputError` naming the key when the manifest lacks one its stage requires)."""
    manifest = load_stage_manifest(stage_dir(run_dir, stage))
    if manifest is None:
        raise StageDirError(
            f"{stage_dir(run_dir, stage) / MANIFEST} not found: stage `{stage}` has not completed "
            f"in {run_dir}; run `specdraft {stage} --run-dir {run_dir}` first")
    return manifest
