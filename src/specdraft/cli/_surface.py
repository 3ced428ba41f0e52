"""The CLI surface as text, one line per option: ``verb  names  type  default``.

``python -m specdraft.cli._surface > tests/cli/cli_surface.txt`` regenerates the golden file
that ``tests/cli/test_cli_surface.py`` compares with; a diff there is a change users see.
Read from the click commands typer builds (what ``--help`` shows), not from the configs.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import typer

#: Options of every command that click adds itself.
IMPLICIT = ("--help",)


def commands() -> dict[str, Any]:
    """``{verb: click command}`` of the ``specdraft`` app, in registration order."""
    from specdraft.cli import app

    return dict(typer.main.get_command(app).commands)


def _type(param: Any) -> str:
    """``int``, ``path``, ``a|b`` (choices), ``json``, ``list`` (comma-separated and/or
    repeated), ``k=v...`` (repeated), ``flag`` (an on/off pair)."""
    if param.metavar and param.param_type_name == "option":
        text = param.metavar.strip("<>").lower()
        if param.multiple:
            text = "list" if "," in text else text + "..."
        return text
    tp = param.type_descriptor.annotation
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if tp is bool:
        return "flag"
    if typing.get_origin(tp) is typing.Literal:
        return "|".join(map(str, typing.get_args(tp)))
    if typing.get_origin(tp) in (list, tuple):
        return f"{typing.get_args(tp)[0].__name__.lower()}..."
    return getattr(tp, "__name__", str(tp)).lower()


def _default(param: Any) -> str:
    """The ``[default: …]`` of the help text (``required``/``-`` when none)."""
    text = param.help or ""
    if "[required" in text:
        return "required"
    if "[default: " in text:
        return text.rsplit("[default: ", 1)[1].rstrip("]")
    if param.default not in (None, False, ()):
        return str(param.default)
    return "-"


def surface_lines() -> list[str]:
    """One line per argument/option of every verb: ``verb  names  type  default``."""
    lines = []
    for verb, cmd in commands().items():
        for p in cmd.params:
            if p.param_type_name == "argument":
                names = p.name.upper()
            else:
                names = ", ".join(p.opts) + "".join(f"/{o}" for o in p.secondary_opts)
            lines.append(f"{verb}  {names}  {_type(p)}  {_default(p)}")
    return lines


def verb_flags() -> dict[str, set[str]]:
    """``{verb: every option name it accepts}``, the off names and ``--help`` included."""
    out = {}
    for verb, cmd in commands().items():
        names = set(IMPLICIT)
        for p in cmd.params:
            names.update(o for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
        out[verb] = names
    return out


if __name__ == "__main__":
    print("\n".join(surface_lines()))
