"""Resume without drift: the settings a stage was started with are compared with the new ones.

A resumed stage continues work done under its stored settings, so a changed setting would be
applied to only part of the output (a learning rate from step N on, a sampling temperature for
the prompts not yet answered) while the manifest records the new value for all of it. Each
resumable stage therefore names the few settings that cannot change what it produces
(:data:`MAY_CHANGE`: where it logs, how often it checkpoints, how many requests it keeps in
flight); those are applied and recorded in the manifest as ``resume_changes``, and any other
difference refuses the resume in one line naming each field as ``old → new`` and the two ways
to start over.

Where the stored settings live: ``train`` keeps them in every checkpoint's ``train_state.pt``
(the settings that produced that checkpoint); ``extract`` and ``generate`` keep them in
``RUN/<stage>/settings.json``, written when the stage starts (:func:`record_settings`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from specdraft.core.atomic import atomic_write_json
from specdraft.core.config import RUN_CONTROL_FIELDS, StageConfig, flag_name
from specdraft.core.errors import StageDirError

SETTINGS_FILE = "settings.json"

# Settings a resume may change, per stage: none of them changes the weights, shards or answers
# the stage computes (docs/resume-and-dtypes.md says what each one does change).
MAY_CHANGE: dict[str, frozenset[str]] = {
    # Checkpoint cadence, logging and its trackers, validation cadence (validation reads the
    # model, never the RNG nor the optimizer; but the validated steps decide which one lands
    # in best/), and the pre-flight teacher check (it runs before step 0).
    # --endpoint's servers, transport and prefetch depth: which servers capture the rows
    # (each probed before the first step), not which rows nor their values.
    "train": frozenset({"save_every", "keep_checkpoints", "log_every", "report_to",
                        "eval_every", "teacher_check", "teacher_check_rows", "endpoint",
                        "capture_dir", "endpoint_concurrency", "endpoint_timeout_s",
                        "online_prefetch"}),
    # The end-of-run spot check (--verify N rows, its --seed) reads the shards, never writes
    # them; the engine's stall limit only decides when a stuck engine is stopped.
    # --endpoint's servers and transport: which servers capture (the identity probe checks
    # each against the stored rows on resume), not what they capture.
    "extract": frozenset({"verify", "seed", "engine_no_progress_s", "endpoint", "capture_dir",
                          "endpoint_concurrency", "endpoint_timeout_s"}),
    # Transport and bookkeeping of the requests, and which prefix of the prompt file is used;
    # the sampling parameters, template, model and reasoning checks are not among them.
    "generate": frozenset({"endpoint", "api_key_env", "concurrency", "timeout_s", "max_retries",
                           "backoff_base_s", "backoff_max_s", "limit", "flush_every",
                           "flush_interval_s", "progress_interval_s"}),
}


def settings_diff(stored: Mapping[str, Any], current: Mapping[str, Any]
                  ) -> dict[str, tuple[Any, Any]]:
    """``{field: (old, new)}`` for every field whose JSON value differs, run-control fields
    (``resume``, ``overwrite``, ``run_dir``) left out. A field missing on one side reads as
    ``None`` there."""
    names = (set(stored) | set(current)) - RUN_CONTROL_FIELDS
    return {k: (stored.get(k), current.get(k)) for k in sorted(names)
            if _canon(stored.get(k)) != _canon(current.get(k))}


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def check_resume_settings(stored: Mapping[str, Any], config: StageConfig, *, stage: str,
                          where: str | Path) -> dict[str, list[Any]]:
    """Compare the stored settings of ``stage`` with ``config``; return the allowed changes as
    ``{field: [old, new]}`` (for the manifest's ``resume_changes``).

    Raises :class:`StageDirError` naming every changed field outside ``MAY_CHANGE[stage]``
    as ``--flag old → new``, ``where`` the stored settings came from, and how to start over.
    """
    diff = settings_diff(stored, config.to_dict())
    allowed = MAY_CHANGE[stage]
    refused = {k: v for k, v in diff.items() if k not in allowed}
    if refused:
        changes = "; ".join(f"{flag_name(k)} {_show(old)} → {_show(new)}"
                            for k, (old, new) in refused.items())
        raise StageDirError(
            f"--resume with changed settings: {changes} (stored in {where}); a resume continues "
            f"the work done under the stored settings, so only "
            f"{', '.join(flag_name(k) for k in sorted(allowed))} may change; resume with the "
            f"stored values, or start over with --overwrite or a new --run-dir")
    return {k: [old, new] for k, (old, new) in diff.items()}


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else repr(value)


def record_settings(out: Path, config: StageConfig, *, stage: str, resume: bool
                    ) -> dict[str, list[Any]]:
    """Check ``RUN/<stage>/settings.json`` against ``config`` when resuming (see
    :func:`check_resume_settings`; a stage started before this file existed has nothing to
    compare, and ``{}`` is returned), then write ``config``'s settings there. Returns the
    allowed changes. Raises :class:`StageDirError` on a refused change or an unreadable file."""
    path = Path(out) / SETTINGS_FILE
    changes: dict[str, list[Any]] = {}
    if resume and path.exists():
        changes = check_resume_settings(read_settings(path), config, stage=stage, where=path)
    atomic_write_json(path, config.to_dict())
    return changes


def read_settings(path: Path) -> dict[str, Any]:
    """The settings object stored at ``path``; :class:`StageDirError` when it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise StageDirError(f"{path}: stored settings cannot be read ({type(err).__name__}); "
                            f"start over with --overwrite or a new --run-dir") from None
    if not isinstance(data, dict):
        raise StageDirError(f"{path}: stored settings are not a JSON object; start over with "
                            f"--overwrite or a new --run-dir")
    return data
