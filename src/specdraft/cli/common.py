"""Helpers shared by the verbs: config-file + flag merging."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, TypeVar

from specdraft.core.config import StageConfig, load_yaml, merge_settings
from specdraft.core.errors import ConfigError

C = TypeVar("C", bound=StageConfig)


def build_config(cls: type[C], *, config_file: Path | None, section: str,
                 flags: dict[str, Any], names: Mapping[str, str] | None = None) -> C:
    """Build a stage config from an optional YAML file and the flags given.

    The YAML may be a whole pipeline config (the stage's settings under ``section``, shared
    ``run_dir`` and ``verifier`` at the top) or just the stage's settings. Flags that are not None
    override the file. Raises :class:`~specdraft.core.errors.ConfigError` naming the flag
    (``names``: how to name fields that are not ``--flag``, e.g. positional arguments).
    """
    values: dict[str, Any] = {}
    source = "flags"
    if config_file is not None:
        data = load_yaml(config_file)
        values = data.get(section) or {} if section in data else data
        if not isinstance(values, dict):
            raise ConfigError(f"{config_file}: section `{section}` must be a mapping, got "
                              f"{type(values).__name__}")
        values = dict(values)
        for shared in ("run_dir", "verifier"):
            if shared in data and shared in cls.model_fields and shared not in values:
                values[shared] = data[shared]
        source = f"{config_file} [{section}] and flags"
    return cls.build(merge_settings(values, flags), source=source, names=names)


CONFIG_OPTION_HELP = "YAML file with this stage's settings (same names as the flags); flags win."
