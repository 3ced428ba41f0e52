"""CLI options generated from a stage's config class: one option per field, help on the field.

A verb is :func:`stage_command` of its :class:`~specdraft.core.config.StageConfig` class: every
field becomes ``flag_name(field)`` (``max_tokens`` -> ``--max-tokens``), its help is the field's
``Field(description=...)`` and ``[default: …]`` is the field's default. Every option defaults to
None, meaning "not given", so ``--config FILE.yaml`` values stay unless a flag overrides them
(:func:`specdraft.cli.common.build_config`). How a field's type is spelled on the command line:

- ``bool``: ``--resume/--no-resume`` (both, so a flag can undo a YAML ``resume: true``);
- ``Literal[...]``: one of the choices; ``int``/``float``/``str``/``Path``: as typed;
- lists and tuples: comma-separated and/or repeated (``--aux-layers 2,15,27``,
  ``--endpoint A --endpoint B``), the items then validated by the config;
- dicts: a JSON object (``--chat-template-kwargs '{"enable_thinking": false}'``);
- any other type (a union such as ``int | str``): the text read as a YAML value, as in a file.

A verb may rename a flag or give it another parser (``generate``'s ``--field KIND=COLUMN``);
the primary name of every field's option is still ``flag_name(field)``, so a validation error
(:func:`specdraft.core.config.format_validation_error`) always names a flag that exists.
"""

from __future__ import annotations

import importlib
import inspect
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Union

import typer
import yaml
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from specdraft.cli.common import CONFIG_OPTION_HELP, build_config
from specdraft.core.config import StageConfig, flag_name, parse_yaml
from specdraft.core.errors import ConfigError
from specdraft.core.jsonl import parse_json

#: Config fields deliberately not on the command line, ``(verb, field) -> reason``. Every other
#: field of a verb's config is an option (tests/cli/test_cli_surface.py checks both ways). None
#: today: a field that only ``specdraft run`` may set (a pipeline-internal handle) goes here.
PIPELINE_INTERNAL: dict[tuple[str, str], str] = {}

Parser = Callable[[Any], Any]


@dataclass(frozen=True)
class Flag:
    """One config field on the command line.

    ``decls`` are the option's names (``("--resume/--no-resume",)``, ``("--field", "--fields")``);
    ``annotation`` is the typer parameter type (always Optional: None = not given);
    ``default`` is the field default as shown (``""``: none shown); ``parse`` turns what typer
    returns into the config's value (None passes through).
    """

    field: str
    decls: tuple[str, ...]
    annotation: Any
    description: str
    default: str
    metavar: str | None = None
    parse: Parser | None = None
    argument: bool = False

    @property
    def help(self) -> str:
        """The field's description, then ``[default: …]`` (or ``[required …]``)."""
        shown = f"[default: {self.default}]" if self.default else ""
        return " ".join(x for x in (self.description, shown) if x)

    def parameter(self) -> inspect.Parameter:
        """The ``inspect.Parameter`` typer reads (name = field, default = typer.Option/Argument)."""
        if self.argument:
            info = typer.Argument(None, help=self.help, show_default=False)
        else:
            info = typer.Option(None, *self.decls, help=self.help, show_default=False,
                                metavar=self.metavar)
        return inspect.Parameter(self.field, inspect.Parameter.KEYWORD_ONLY, default=info,
                                 annotation=self.annotation)

    def value(self, given: Any) -> Any:
        """The config value for what was given on the command line (None: not given)."""
        if given is None or (isinstance(given, (list, tuple)) and not given):
            return None
        return self.parse(given) if self.parse else given


def _strip_optional(tp: Any) -> Any:
    """``X | None`` -> ``X`` (other types unchanged)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _kind(tp: Any) -> str:
    """``bool``, ``choice``, ``scalar``, ``list``, ``dict`` or ``text``: how it is spelled."""
    origin = typing.get_origin(tp)
    if tp is bool:
        return "bool"
    if origin is Literal:
        return "choice"
    if origin in (list, tuple) or tp in (list, tuple):
        return "list"
    if origin is dict or tp is dict:
        return "dict"
    if tp in (int, float, str, Path):
        return "scalar"
    return "text"  # anything else (a union, a model): read as YAML, as in --config


def split_list(items: list[str]) -> list[str]:
    """``["2,15", "27"]`` -> ``["2", "15", "27"]``: repeated and comma-separated, stripped."""
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


def json_object(flag: str) -> Parser:
    """A parser of a JSON object flag; raises :class:`ConfigError` naming ``flag``."""
    def parse(text: str) -> dict[str, Any]:
        try:
            value = parse_json(text)
        except ValueError as err:
            raise ConfigError(f"{flag}: not valid JSON ({err})") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{flag}: expected a JSON object, got {type(value).__name__}")
        return value
    return parse


def yaml_value(flag: str) -> Parser:
    """A parser reading the flag's text as a YAML value (``7`` -> 7, ``auto`` -> "auto"), the
    way ``--config`` would; raises :class:`ConfigError` naming ``flag``."""
    def parse(text: str) -> Any:
        try:
            return parse_yaml(text)
        except (yaml.YAMLError, ValueError) as err:
            raise ConfigError(f"{flag}: not a valid value ({' '.join(str(err).split())[:300]})"
                              ) from None
    return parse


def field_default(info: FieldInfo) -> Any:
    """The field's default (``default_factory`` called); PydanticUndefined when required."""
    if info.default_factory is not None:
        return info.default_factory()
    return info.default


def default_text(name: str, info: FieldInfo, decls: tuple[str, ...]) -> str:
    """What ``[default: …]`` shows: the field's default; ``""`` (nothing) for None or empty;
    ``on``/``off`` for a bool, or the name of a flag pair like ``--online/--offline``."""
    value = field_default(info)
    if value is PydanticUndefined or value is None or value in ((), [], {}):
        return ""
    if isinstance(value, bool):
        on, _, off = decls[0].partition("/")
        if off in ("", flag_name("no_" + name)):
            return "on" if value else "off"
        return (on if value else off).lstrip("-")
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, str) and (value != value.strip() or "\n" in value):
        return json.dumps(value)
    return str(value)


def make_flag(name: str, info: FieldInfo, *, decls: tuple[str, ...] | None = None,
              parse: Parser | None = None, argument: bool = False) -> Flag:
    """The :class:`Flag` of config field ``name`` (typer type, names, help and default shown).

    A dict field given its own ``parse`` takes repeated strings (``--field K=V --field K2=V2``).
    """
    tp = _strip_optional(info.annotation)
    kind = _kind(tp)
    if kind == "dict" and parse is not None:
        kind = "list"
    flag = flag_name(name)
    annotation: Any = {"bool": Optional[bool], "choice": Optional[tp], "scalar": Optional[tp],
                       "list": Optional[list[str]], "dict": Optional[str],
                       "text": Optional[str]}[kind]
    if parse is None:
        parse = {"list": split_list, "dict": json_object(flag), "text": yaml_value(flag)}.get(kind)
    if decls is None:
        decls = (f"{flag}/{flag_name('no_' + name)}",) if kind == "bool" else (flag,)
    if flag not in (d.split("/")[0] for d in decls):
        raise ValueError(f"{name}: the names must include {flag} (errors name it), got {decls}")
    description = " ".join((info.description or "").split())
    if info.is_required():
        description += " [required, here or in --config]"
    metavar = {"list": "<k=v>" if _kind(tp) == "dict" else "<a,b,..>",
               "dict": "<json>"}.get(kind)
    return Flag(name, decls, annotation, description.strip(), default_text(name, info, decls),
                metavar, parse, argument)


def config_flags(cls: type[StageConfig], verb: str, *, arguments: tuple[str, ...] = (),
                 names: dict[str, tuple[str, ...]] | None = None,
                 parsers: dict[str, Parser] | None = None) -> list[Flag]:
    """One :class:`Flag` per field of ``cls`` (but :data:`PIPELINE_INTERNAL`), in field order.

    ``arguments`` become positional arguments; ``names``/``parsers`` override a field's option
    names or its parser.
    """
    names, parsers = names or {}, parsers or {}
    return [make_flag(name, info, decls=names.get(name), parse=parsers.get(name),
                      argument=name in arguments)
            for name, info in cls.model_fields.items() if (verb, name) not in PIPELINE_INTERNAL]


def _resolve(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """``"module:function"`` -> the function, imported now (stage code loads torch)."""
    if callable(ref):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def echo_figures(manifest: Any, verb: str, where: Any = None) -> None:
    """Print ``VERB: FIGURES`` — the typed manifest's :meth:`figures` line (``manifest``: the
    stage's :class:`~specdraft.core.manifest.Manifest`, or its JSON), the same one
    ``specdraft run`` and its summary print — then ``VERB: -> WHERE`` when given."""
    from specdraft.core.manifest import parse_manifest

    typer.echo(f"{verb}: {parse_manifest(manifest, verb).figures()}")
    if where is not None:
        typer.echo(f"{verb}: -> {where}")


def stage_command(cls: type[StageConfig], *, verb: str, help: str,
                  run: str | Callable[[Any], Any], echo: Callable[[Any, Any], None],
                  arguments: tuple[str, ...] = (),
                  names: dict[str, tuple[str, ...]] | None = None,
                  parsers: dict[str, Parser] | None = None) -> Callable[..., None]:
    """The typer command of a stage: its config's fields as options plus ``--config FILE``.

    The command builds the config (YAML section ``verb`` of ``--config``, then the flags given),
    calls ``run(config)`` (a ``"module:function"`` imported only then, or a callable) and
    ``echo(result, config)``. Errors are :class:`ConfigError` naming the flag (exit 2 in
    :func:`specdraft.cli.main`).
    """
    if "config" in cls.model_fields:
        raise TypeError(f"{cls.__name__}: a field named `config` would hide --config FILE")
    flags = config_flags(cls, verb, arguments=arguments, names=names, parsers=parsers)
    by_field = {f.field: f for f in flags}
    positional = {f.field: f.field.upper() for f in flags if f.argument}

    def command(**given: Any) -> None:
        config_file = given.pop("config")
        values = {name: by_field[name].value(v) for name, v in given.items()}
        cfg = build_config(cls, config_file=config_file, section=verb, flags=values,
                           names=positional)
        echo(_resolve(run)(cfg), cfg)

    config = inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                               default=typer.Option(None, "--config", metavar="FILE",
                                                    help=CONFIG_OPTION_HELP))
    params = [f.parameter() for f in flags if f.argument] + \
             [f.parameter() for f in flags if not f.argument] + [config]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = help
    command.__name__ = verb
    command.config_class = cls  # type: ignore[attr-defined]
    command.flags = tuple(flags)  # type: ignore[attr-defined]
    return command
