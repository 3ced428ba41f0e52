"""The base of every stage config: frozen, keyword-only, validated on construction.

A stage config is built once at the edge (CLI flags or a YAML section) and never mutated. Field
names are the CLI flag names with ``-`` for ``_`` (``max_tokens`` is ``--max-tokens``), so a
validation error can name the flag to change.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from specdraft.core.errors import ConfigError, clip
from specdraft.core.jsonl import parse_json, shape_problem


RUN_CONTROL_FIELDS = frozenset({"resume", "overwrite", "run_dir"})


class StageConfig(BaseModel):
    """Base class for stage configs (pydantic, frozen, unknown keys refused)."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; reloadable with :meth:`build`."""
        return self.model_dump(mode="json")

    def config_hash(self) -> str:
        """sha256 of the canonical JSON of this config (first 16 hex digits).

        Run-control fields (:data:`RUN_CONTROL_FIELDS`: ``resume``, ``overwrite``, ``run_dir``)
        are left out: they change how a stage starts or where it writes, not what it produces,
        so a run directory moved or copied elsewhere keeps its complete stages.
        """
        values = {k: v for k, v in self.to_dict().items() if k not in RUN_CONTROL_FIELDS}
        blob = json.dumps(values, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @classmethod
    def build(cls, values: dict[str, Any], *, source: str = "flags",
              names: Mapping[str, str] | None = None):
        """Validate ``values`` into a config, or raise :class:`ConfigError` naming the flags.

        ``source`` (e.g. ``"configs/demo.yaml [train]"``) is named in the message; ``names``
        overrides how a field is named there (a positional argument: ``{"target": "TARGET"}``).
        """
        try:
            return cls(**values)
        except ValidationError as err:
            raise ConfigError(format_validation_error(err, source, names)) from None


def parse_json_object(value: Any) -> Any:
    """A JSON-object flag (``'{"enable_thinking": false}'``) as a dict; None and dicts pass
    through. Raises ``ValueError`` (a validation error naming the flag) otherwise."""
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            value = parse_json(value)
        except ValueError as err:
            raise ValueError(f"not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value


def parse_layer_ids(value: Any) -> Any:
    """A comma-separated layer-id flag (``"2,15,27"``) as a tuple of ints; other values pass
    through to the field's own validation. Raises ``ValueError`` naming the expected form."""
    if isinstance(value, str):
        try:
            return tuple(int(x) for x in value.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"expected comma-separated layer ids like 2,15,27, "
                             f"got {value!r}") from None
    return value


def check_http_urls(urls: list[str]) -> list[str]:
    """``urls`` unchanged when each starts with ``http://`` or ``https://`` (server base URLs of
    ``generate --endpoint`` and ``extract --endpoint``); else :class:`ValueError` naming it."""
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http(s) URL")
    return urls


def flag_name(field: str) -> str:
    """``max_tokens`` -> ``--max-tokens``."""
    return "--" + field.replace("_", "-")


def _key_name(key: object) -> str:
    """A key of a config file as named in a message: as is when it is a plain name, else its
    clipped ``repr`` (a key holding newlines or a megabyte of text stays on one short line)."""
    text = str(key)
    return text if text.isidentifier() or text.isdigit() else clip(text, 40)


def format_validation_error(err: ValidationError, source: str,
                            names: Mapping[str, str] | None = None) -> str:
    """One line: ``invalid settings from SOURCE: --flag (field): message; ...``.

    The flag is :func:`flag_name` of the field (the CLI generates exactly that option for every
    field, see :mod:`specdraft.cli.options`) unless ``names`` names it otherwise.
    """
    names = names or {}
    parts = []
    for e in err.errors():
        if not e["loc"]:
            parts.append(e["msg"])
            continue
        field = ".".join(_key_name(x) for x in e["loc"])
        top = str(e["loc"][0])
        flag = names.get(top) or (flag_name(top) if top.isidentifier() else _key_name(top))
        parts.append(f"{flag} ({field}): {' '.join(e['msg'].split())}")
    return f"invalid settings from {source}: " + "; ".join(parts)


YAML_MAX_VALUES = 100_000
"""Most values a config file may expand to (aliases count each time they are used)."""


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with ``yaml.safe_load`` (plain data only: no Python objects are
    ever constructed); raise :class:`ConfigError` naming the file (and line) on any problem:
    unreadable, not UTF-8, not YAML, nested past :data:`~specdraft.core.jsonl.MAX_DEPTH` or
    expanding (through aliases) to more than :data:`YAML_MAX_VALUES` values."""
    path = Path(path)
    try:
        data = parse_yaml(path.read_bytes().decode("utf-8-sig"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as err:
        raise ConfigError(f"{path}: config file cannot be read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 (byte offset {err.start})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(err).split())[:400]}"
                          ) from None
    except ValueError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``; raises :class:`yaml.YAMLError` or :class:`ValueError` only.

    ``safe_load`` can also raise RecursionError (deep nesting), ValueError/OverflowError (a
    timestamp or number its constructors cannot build) or TypeError: all become ValueError.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        raise
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except (ValueError, OverflowError, TypeError) as err:
        raise ValueError(f"a value cannot be read ({type(err).__name__}: {err})") from None
    problem = shape_problem(data, max_nodes=YAML_MAX_VALUES)
    if problem:
        raise ValueError(problem)
    return data


def merge_settings(file_values: dict[str, Any], flag_values: dict[str, Any]) -> dict[str, Any]:
    """Flags given on the command line (not None) override values from a config file."""
    merged = dict(file_values)
    merged.update({k: v for k, v in flag_values.items() if v is not None})
    return merged
