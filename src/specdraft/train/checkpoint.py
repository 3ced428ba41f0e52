"""Training checkpoints: ``RUN/train/checkpoints/step-N/`` = a drafter directory
(:func:`specdraft.models.io.save_drafter`) + ``train_state.pt``.

``train_state.pt`` holds the optimizer and scheduler states, the RNG states (Python, torch CPU,
CUDA when present), the data position ``(epoch, step_in_epoch)``, the global step, tokens seen
and the best validation ``τ̂`` so far. A step directory is written under a temporary name and
renamed into place (:func:`specdraft.core.atomic.atomic_dir`); on resume the newest directory
that loads and holds every piece of state (:func:`missing_pieces`) is used, and ones that do not
are reported and skipped; when none is left the resume is refused, naming what each lacks.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import torch

from specdraft.core.atomic import atomic_dir, remove_stale_tmp
from specdraft.core.errors import StageDirError
from specdraft.artifacts.drafter import load_drafter
from specdraft.models.io import Drafter, save_drafter

STATE_FILE = "train_state.pt"
# The pieces of ``train_state.pt`` a resume needs (besides the drafter directory itself).
STATE_KEYS = ("step", "epoch", "step_in_epoch", "tokens_seen", "best_tau", "best_step",
              "best_val", "last_val", "optimizer", "scheduler", "rng")
# Sub-pieces: an optimizer state dict, a LambdaLR state dict, the generator states.
STATE_SUBKEYS = {"optimizer": ("state", "param_groups"), "scheduler": ("last_epoch", "base_lrs"),
                 "rng": ("python", "torch")}


def rng_state() -> dict[str, Any]:
    """Python, torch CPU and (when present) CUDA generator states."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step}"


def save_checkpoint(root: Path, step: int, drafter: Drafter,
                    train_state: dict[str, Any]) -> Path:
    """Write ``root/step-<step>/`` atomically (drafter files + ``train_state.pt``)."""
    with atomic_dir(step_dir(root, step)) as tmp:
        save_drafter(drafter, tmp)
        torch.save(train_state, tmp / STATE_FILE)
    return step_dir(root, step)


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of the step directories under ``root``, oldest first."""
    root = Path(root)
    if not root.exists():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step-") and p.name[5:].isdigit():
            found.append((int(p.name[5:]), p))
    return sorted(found)


def missing_pieces(state: Any) -> list[str]:
    """The pieces of state (:data:`STATE_KEYS`, ``optimizer.state``...) that ``state`` lacks,
    plus ``config`` when it records neither the settings nor their hash; [] when complete."""
    if not isinstance(state, dict):
        return ["the whole state (not a dict)"]
    missing = [k for k in STATE_KEYS if k not in state]
    for key, subkeys in STATE_SUBKEYS.items():
        if key in state:
            part = state[key]
            missing += [f"{key}.{s}" for s in subkeys
                        if not isinstance(part, dict) or s not in part]
    if "config" not in state and "config_hash" not in state:
        missing.append("config")
    return missing


def load_latest(root: Path) -> tuple[Drafter, dict[str, Any], Path] | None:
    """The newest usable checkpoint as ``(drafter, train_state, path)``; None when there is no
    step directory at all.

    Leftovers of interrupted writes are deleted first; a step directory that does not load, or
    whose state lacks a piece (:func:`missing_pieces`), is skipped with a warning (distrust what
    cannot be read). Raises :class:`StageDirError` naming each directory and what it lacks when
    step directories exist but none is usable (resuming from nothing would silently restart).
    """
    remove_stale_tmp(root)
    problems = []
    for step, path in reversed(list_checkpoints(root)):
        try:
            drafter = load_drafter(path)
            state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unreadable file disqualifies it
            first = (str(err).strip().splitlines() or [""])[0][:200]
            problems.append(f"{path.name}: unreadable ({type(err).__name__}: {first})")
        else:
            missing = missing_pieces(state)
            if not missing:
                return drafter, state, path
            problems.append(f"{path.name}: {STATE_FILE} lacks {', '.join(missing)}")
        print(f"specdraft train: skipping checkpoint {problems[-1]}")
    if problems:
        raise StageDirError(f"{root}: no checkpoint can be resumed from ({'; '.join(problems)}); "
                            f"start over with --overwrite or a new --run-dir")
    return None


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` step directories; return the deleted paths."""
    old = [p for _, p in list_checkpoints(root)[:-keep]] if keep > 0 else []
    for p in old:
        shutil.rmtree(p)
    return old
