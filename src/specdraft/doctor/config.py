"""Settings of ``specdraft doctor``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from specdraft.core.config import StageConfig


class DoctorConfig(StageConfig):
    """``target``: a run directory (its export, else ``RUN/train/best``) or a drafter directory
    (exported or specdraft's). ``verifier``: the model the drafter will be served with."""

    target: Path
    verifier: str = "smollm2"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
