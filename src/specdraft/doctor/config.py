"""Settings of ``specdraft doctor``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from specdraft.core.config import StageConfig


class DoctorConfig(StageConfig):
    """Settings of the doctor: the drafter to check and the verifier it will be served with."""

    target: Path = Field(description="Run directory (its export, else RUN/train/best) or "
                                     "drafter directory (exported or specdraft's).")
    verifier: str = Field("smollm2", description="HF model dir, .gguf file or smollm2: the "
                                                 "model the drafter will be served with.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="The verifier's "
                                                                              "dtype.")
