"""Settings of ``specdraft run``: one YAML with shared keys and a section per stage.

```yaml
run_dir: runs/demo          # shared: every stage's --run-dir
verifier: smollm2           # shared: HF dir, .gguf file, or the embedded default
device: cpu                 # shared: where the verifier runs (generate/extract/train/eval)
generate: {prompts: builtin:demo_train, max_tokens: 128}
prepare: {max_seq_len: 1024}
...
```

Each section takes exactly the fields of that stage's config (the stage's CLI flags with
``_``); the shared keys are filled into every section that has such a field and does not set
it. Sections are validated on load, each error naming the section and flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from specdraft.core.config import StageConfig, load_yaml
from specdraft.core.errors import ConfigError
from specdraft.pipeline.stages import STAGE_NAMES, STAGES

SHARED_KEYS = ("run_dir", "verifier", "device")


@dataclass(frozen=True)
class PipelineConfig:
    """The resolved pipeline: shared keys and one validated stage config per stage."""

    run_dir: str
    verifier: str
    device: str
    stages: dict[str, StageConfig]
    source: str

    @classmethod
    def from_yaml(cls, path: str | Path, *, run_dir: str | None = None,
                  selected: Sequence[str] | None = None) -> "PipelineConfig":
        """Load and validate ``path``; ``run_dir`` (the ``--run-dir`` flag) overrides the file's.

        ``selected`` (default: every stage) are the stages ``--from``/``--until`` will run. A
        stage is validated when it is selected or its section is in the file; an absent section
        of a stage that will not run is left out of ``stages`` (``--until export`` needs no
        ``eval`` section and its required ``prompts``).

        Raises :class:`ConfigError` naming the file, section and flag.
        """
        data = load_yaml(path)
        unknown = sorted(set(data) - set(SHARED_KEYS) - set(STAGE_NAMES))
        if unknown:
            raise ConfigError(f"{path}: unknown key(s) {unknown}; expected {list(SHARED_KEYS)} "
                              f"and stage sections {list(STAGE_NAMES)}")
        shared = {"run_dir": run_dir or data.get("run_dir"),
                  "verifier": data.get("verifier", "smollm2"), "device": data.get("device", "cpu")}
        if not shared["run_dir"]:
            raise ConfigError(f"{path}: set `run_dir:` (or pass --run-dir)")
        for spec in STAGES:
            if not isinstance(data.get(spec.name) or {}, dict):
                raise ConfigError(f"{path}: section `{spec.name}` must be a mapping, got "
                                  f"{type(data[spec.name]).__name__}")
        sections = {spec.name: dict(data.get(spec.name) or {}) for spec in STAGES}
        _eval_the_export(sections, shared["run_dir"])
        wanted = set(STAGE_NAMES if selected is None else selected) | {
            name for name in STAGE_NAMES if data.get(name) is not None}
        stages = {spec.name: _stage_config(spec, sections[spec.name], shared, path)
                  for spec in STAGES if spec.name in wanted}
        return cls(stages=stages, source=str(path), **shared)


def _eval_the_export(sections: dict[str, dict[str, Any]], run_dir: str) -> None:
    """Unless told otherwise, ``eval`` measures the exported drafter: the artifact deployed."""
    export = sections["export"]
    out = export.get("out") or str(Path(run_dir) / "export" / export.get("format", "sglang"))
    if not sections["eval"].get("drafter"):
        sections["eval"]["drafter"] = out


def _stage_config(spec: Any, section: dict[str, Any], shared: dict[str, Any],
                  path: str | Path) -> StageConfig:
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: section `{spec.name}` must be a mapping")
    cls = spec.load_config_cls()
    values = dict(section)
    for key, value in shared.items():
        if key in cls.model_fields and key not in values:
            values[key] = value
    for key in ("resume", "overwrite"):
        if key in values:
            raise ConfigError(f"{path} [{spec.name}]: `{key}` is decided by `specdraft run` "
                              f"(it resumes partial stages and reruns changed ones); remove it")
    return cls.build(values, source=f"{path} [{spec.name}]")
