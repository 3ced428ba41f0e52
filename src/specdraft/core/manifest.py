"""Stage manifests: ``RUN/<stage>/manifest.json``, written last and atomically.

A stage is complete iff its manifest exists. The manifest records everything needed to trust and
reproduce the output: the resolved config (reloadable as input) and its hash, argv, library
versions, the git revision of specdraft, hashes of the inputs, counts in/out/rejected by reason,
start and end times (UTC ISO-8601) and elapsed seconds.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from specdraft.core import lock
from specdraft.core.errors import InputError
from specdraft.core.atomic import atomic_write_json

MANIFEST = "manifest.json"
_VERSIONED = ("specdraft", "torch", "transformers", "datasets", "safetensors", "httpx", "gguf")


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """sha256 hex digest of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def manifest_path(stage_dir: str | os.PathLike) -> Path:
    return Path(stage_dir) / MANIFEST


def read_manifest(stage_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The stage's manifest, or None if the stage is not complete.

    Raises :class:`~specdraft.core.errors.InputError` naming the file (and line) when it is not
    UTF-8 JSON or not an object (a manifest is written atomically, so this means it was edited
    or copied badly: rerun the stage with ``--overwrite``).
    """
    from specdraft.core.jsonl import read_json

    path = manifest_path(stage_dir)
    if not path.exists():
        return None
    data = read_json(path, what="stage manifest")
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}; rerun "
                         f"the stage with --overwrite")
    return data


def input_hash(stage_dir: str | os.PathLike) -> str:
    """Hash identifying an upstream stage's output: the sha256 of its manifest file.

    Cheap even for terabytes of shards, and it changes whenever the upstream stage reruns.
    """
    return file_sha256(manifest_path(stage_dir))


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_revision() -> str | None:
    """The git revision of the specdraft source tree, or None when not in a checkout."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return rev.stdout.strip() or None if rev.returncode == 0 else None


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class StageClock:
    """Start time of a stage, taken when the stage begins (for the manifest)."""

    def __init__(self) -> None:
        self.started_at = utc_now()
        self._t0 = time.monotonic()

    def elapsed_s(self) -> float:
        return round(time.monotonic() - self._t0, 3)


def write_manifest(stage_dir: str | os.PathLike, *, stage: str, config: Any, clock: StageClock,
                   inputs: dict[str, str] | None = None, counts: dict[str, Any] | None = None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``stage_dir/manifest.json`` atomically and return its content.

    ``config`` is a :class:`~specdraft.core.config.StageConfig`; ``inputs`` maps an input name
    (``"prepare"``, ``"prompts"``) to its hash; ``counts`` holds in/out/rejected-by-reason
    figures; ``extra`` holds stage-specific facts (conventions, token ids, sizes).
    """
    manifest = {
        "stage": stage,
        "config": config.to_dict(),
        "config_hash": config.config_hash(),
        "argv": list(sys.argv),
        "versions": library_versions(),
        "git_revision": git_revision(),
        "inputs": inputs or {},
        "counts": counts or {},
        "started_at": clock.started_at,
        "finished_at": utc_now(),
        "elapsed_s": clock.elapsed_s(),
        **(extra or {}),
    }
    atomic_write_json(manifest_path(stage_dir), manifest)
    lock.release(stage_dir)  # the stage is complete: another process may take it now
    return manifest
