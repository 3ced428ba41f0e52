"""Settings of ``specdraft export`` (field names = CLI flags with ``_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidatorFunctionWrapHandler, field_validator, model_validator

from specdraft import kinds
from specdraft.core.config import StageConfig, parse_layer_ids


class ExportConfig(StageConfig):
    """Settings of the export stage: the engine format, the output directory and whether the
    verifier's embedding is copied into the checkpoint.
    """

    run_dir: Path | None = Field(None, description="Run directory; reads RUN/train/best and "
                                                   "RUN/extract/, writes RUN/export/FORMAT.")
    drafter: Path | None = Field(None, description="A specdraft drafter directory instead of "
                                                   "RUN/train/best.")
    format: Literal["sglang", "vllm", "speculators"] = Field(
        "sglang", description="Checkpoint format: sglang (vLLM loads it too), vllm or "
                              "speculators.")
    out: Path | None = Field(None, description="Output directory (none: RUN/export/FORMAT).")
    verifier: str | None = Field(None, description="HF model dir, .gguf file or smollm2: its "
                                                   "layer count and embedding.")
    verifier_name: str | None = Field(None, description="speculators' verifier.name_or_path "
                                                        "(none: --verifier).")
    embed: Literal["auto", "copy", "omit"] = Field(
        "auto", description="The verifier's embedding: copy it (from RUN/extract/"
                            "verifier_head.safetensors or --verifier), omit it (the engine "
                            "shares the verifier's), or auto: copy when it is known.")
    speculative_tokens: int = Field(3, ge=1, description="speculators' proposal length k.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Dtype of the float tensors; auto keeps the trained one.")
    aux_layers: tuple[int, ...] | None = Field(
        None, description="The aux ids the features were extracted with, when no "
                          "RUN/extract/manifest.json records them (comma-separated).")
    allow_other_verifier: bool = Field(
        False, description="Export even when --verifier is not the model the drafter was "
                           "trained on (recorded in the manifest).")
    trust_remote_code: bool = Field(False, description="Allow --verifier's own code (a "
                                                       "config.json auto_map).")
    overwrite: bool = Field(False, description="Replace the output directory.")

    @field_validator("format", mode="wrap")
    @classmethod
    def _kind_format(cls, value: object, handler: ValidatorFunctionWrapHandler) -> str:
        """The flag's choices are the built-in kinds' formats; a format of a kind registered
        from outside (:func:`specdraft.kinds.register`) is accepted from a config as well."""
        if isinstance(value, str) and any(value in k.formats for k in kinds.KINDS.values()):
            return value
        return handler(value)

    @field_validator("aux_layers", mode="before")
    @classmethod
    def _parse_aux(cls, v: object) -> object:
        return parse_layer_ids(v)

    @model_validator(mode="after")
    def _need_source(self) -> "ExportConfig":
        if self.run_dir is None and self.drafter is None:
            raise ValueError("give --run-dir RUN (reads RUN/train/best) or --drafter DIR")
        if self.run_dir is None and self.out is None:
            raise ValueError("--out DIR is required when no --run-dir is given")
        return self
