"""``RUN/vocab/vocab_map.safetensors``: the draft vocabulary as ``d2t`` int64 [K] and ``t2d`` bool
[V] (``target = draft + d2t[draft]``; the contract is :mod:`specdraft.core.conventions`).
Written by ``specdraft vocab``, read by ``train``, ``doctor`` and the benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specdraft.core.atomic import atomic_open
from specdraft.core.conventions import vocab_map_problems
from specdraft.core.errors import InputError

if TYPE_CHECKING:
    import torch

VOCAB_FILE = "vocab_map.safetensors"


def vocab_map_path(run_dir: Path) -> Path:
    """``RUN/vocab/vocab_map.safetensors`` (:attr:`RunLayout.vocab_map`)."""
    from specdraft.artifacts.layout import RunLayout

    return RunLayout(run_dir).vocab_map


def save_vocab_map(path: Path, d2t: np.ndarray, t2d: np.ndarray) -> None:
    """Write ``d2t`` (cast to int64) and ``t2d`` (cast to bool) atomically with safetensors (no
    torch needed)."""
    from safetensors.numpy import save

    blob = save({"d2t": np.ascontiguousarray(d2t, dtype=np.int64),
                 "t2d": np.ascontiguousarray(t2d, dtype=bool)})
    with atomic_open(path, "wb") as f:
        f.write(blob)


def load_vocab_map(run_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t [K] int64, t2d [V] bool)`` from ``RUN/vocab``.

    Raises :class:`InputError` when the file is missing or the two disagree (every ``draft +
    d2t[draft]`` must be a distinct id with ``t2d`` set)."""
    from safetensors.torch import load_file

    path = vocab_map_path(run_dir)
    if not path.exists():
        raise InputError(f"{path} not found; run `specdraft vocab --run-dir {run_dir}` first")
    tensors = load_file(str(path))
    d2t, t2d = tensors["d2t"].long(), tensors["t2d"].bool()
    problems = vocab_map_problems(d2t, t2d)
    if problems:
        raise InputError(f"{path}: {'; '.join(problems)}")
    return d2t, t2d
