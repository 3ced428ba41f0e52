"""The run directory contract.

Stage ``S`` writes only under ``RUN/S/`` and finishes by atomically writing
``RUN/S/manifest.json``; a stage is complete iff its manifest exists. Inputs of a stage are the
manifests of the stages before it (see :func:`require_stage`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from specdraft.core import lock
from specdraft.core.atomic import remove_stale_tmp
from specdraft.core.errors import StageDirError
from specdraft.core.manifest import MANIFEST, Manifest, load_stage_manifest
from specdraft.core.resume import SETTINGS_FILE


def stage_dir(run_dir: str | Path, stage: str) -> Path:
    """``RUN/<stage>``."""
    return Path(run_dir) / stage


def check_stage_dir(run_dir: str | Path, stage: str, *, resume: bool = False,
                    overwrite: bool = False, resumable: bool = True) -> Path:
    """Lock ``RUN/<stage>`` for this process and refuse what :func:`open_stage_dir` would
    refuse, changing nothing; return the path.

    A stage whose own checks come after its inputs are loaded (train: the drafter's settings
    against the extracted layers, the teacher check; extract: the verifier's binding and aux
    layers) calls this first and :func:`open_stage_dir` once those checks pass, so a refused
    ``--overwrite`` deletes nothing (a trained drafter or hours of hidden states stay).
    Raises :class:`StageDirError` for both flags, a directory another process holds, or work
    there without ``--resume``/``--overwrite``.
    """
    if resume and overwrite:
        raise StageDirError("--resume and --overwrite exclude each other; pass one")
    path = stage_dir(run_dir, stage)
    held = lock.holds(path)
    lock.acquire(path, what=f"specdraft {stage}", claim=False)
    if not (overwrite or resume) and holds_work(path):
        if not held:
            lock.release(path)
        state = "complete" if (path / MANIFEST).exists() else "partial"
        how = "pass --resume to continue it or " if resumable else "pass "
        raise StageDirError(f"{path} already holds {state} output of `specdraft {stage}`; "
                            f"{how}--overwrite to delete it and start over")
    return path


def open_stage_dir(run_dir: str | Path, stage: str, *, resume: bool = False,
                   overwrite: bool = False, resumable: bool = True) -> Path:
    """Lock ``RUN/<stage>`` for this process, make it ready for writing and return it.

    The lock (:mod:`specdraft.core.lock`) is taken first: a second process on the same stage
    directory is refused with :class:`StageDirError` naming the running one. Then:

    - empty, missing, or holding no work (no manifest, only leftovers of interrupted atomic
      writes ``*.tmp-*`` / ``*.old-*`` and empty files: what a failed start leaves): cleaned and
      used as new;
    - holding work, neither flag: refused with :class:`StageDirError` (nothing is clobbered);
    - ``overwrite``: its content is deleted;
    - ``resume``: kept as is, except the manifest (the stage is being run again) and leftovers of
      interrupted atomic writes, which are removed.

    ``resumable``: the stage has a ``--resume`` flag (the refusal names only flags that exist).
    A refused command leaves the lock file as it found it (the holder line is written only once
    the directory is accepted). The refusals are :func:`check_stage_dir`'s.
    """
    path = check_stage_dir(run_dir, stage, resume=resume, overwrite=overwrite,
                           resumable=resumable)
    lock.claim(path)
    if overwrite or not holds_work(path):
        _clear(path)
    else:
        (path / MANIFEST).unlink(missing_ok=True)
        remove_stale_tmp(path)
    return path


def holds_work(path: Path) -> bool:
    """True when ``path`` holds a manifest or any non-empty file outside the lock, the stored
    settings (:data:`specdraft.core.resume.SETTINGS_FILE`, written before any work) and the
    leftovers of interrupted atomic writes (those are never resumed from)."""
    if (path / MANIFEST).exists():
        return True
    for p in path.rglob("*"):
        rel = p.relative_to(path)
        if rel.name == lock.LOCK_FILE or str(rel) == SETTINGS_FILE or \
                any(".tmp-" in q or ".old-" in q for q in rel.parts):
            continue
        if p.is_file() and p.stat().st_size > 0:
            return True
    return False


def _clear(path: Path) -> None:
    """Delete everything in ``path`` but the lock file (held by this process)."""
    for p in path.iterdir():
        if p.name != lock.LOCK_FILE:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


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
