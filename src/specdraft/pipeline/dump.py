"""``specdraft run --dump-config``: a commented default pipeline YAML built from the stage
configs."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import yaml
from pydantic_core import PydanticUndefined

from specdraft.pipeline.config import SHARED_KEYS
from specdraft.pipeline.stages import STAGES

_HEADER = """\
# specdraft pipeline config: `specdraft run THIS.yaml`.
# Shared keys fill every stage section that has such a field; each section takes the stage's
# CLI flags with `_` for `-` (see `specdraft <stage> --help`). Stages whose manifest, config and
# inputs are unchanged are skipped on a rerun; `resume`/`overwrite` are decided by `run`.
run_dir: runs/my-run        # required
verifier: smollm2           # HF model dir, .gguf file, or smollm2 (the embedded default)
device: cpu                 # cpu, cuda, cuda:1, ...
# The run's one chat format, filled into generate, prepare and eval (set it here or in one
# section, never differently in two): template (file), template_kwargs, think_tokens
# ([opener, closer]), stop_tokens (list).
chat: {}
"""


def _default(field: Any) -> Any:
    if field.default is not PydanticUndefined:
        return field.default
    if field.default_factory is not None:
        return field.default_factory()
    return None


def _yaml_value(value: Any) -> str:
    """One-line YAML for a default (strings as JSON, which YAML reads back unchanged)."""
    if isinstance(value, str):
        return json.dumps(value)
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix(
        "\n...").removesuffix("...").strip()


#: Values that make the dumped file run as it is (required fields, the shipped demo prompts).
EXAMPLES = {("generate", "prompts"): "builtin:demo_train", ("eval", "prompts"): "builtin:demo_eval"}


def _about(cls: type) -> list[str]:
    """The first paragraph of a config class docstring, as comment lines."""
    para = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
    return ["# " + line for line in textwrap.wrap(para, 94)]


def dump_default_config() -> str:
    """The text of a complete, commented default config (every field with its default)."""
    parts = [_HEADER]
    for spec in STAGES:
        cls = spec.load_config_cls()
        parts += ["", f"# --- {spec.name} (`specdraft {spec.name} --help`)", *_about(cls),
                  f"{spec.name}:"]
        for name, field in cls.model_fields.items():
            if name in SHARED_KEYS or name in ("resume", "overwrite"):
                continue
            example = EXAMPLES.get((spec.name, name))
            value = _yaml_value(example if example is not None else _default(field))
            note = "  # required" if field.is_required() else ""
            parts.append(f"  {name}: {value}{note}")
    return "\n".join(parts) + "\n"
