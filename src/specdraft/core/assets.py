"""Files shipped inside the package, addressed as ``builtin:NAME`` wherever a path is taken.

``builtin:demo_train`` and ``builtin:demo_eval`` are the demo prompt sets written for specdraft
(``assets/prompts/``, Apache-2.0): the embedded default needs nothing outside the package.
"""

from __future__ import annotations

from pathlib import Path

from specdraft.core.errors import ConfigError

PREFIX = "builtin:"
_PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts"


def builtin_names() -> list[str]:
    return sorted(p.stem for p in _PROMPTS.glob("*.jsonl"))


def resolve_path(path: str | Path) -> Path:
    """``builtin:NAME`` -> the shipped file; any other value -> ``Path(value)``.

    Raises :class:`ConfigError` listing the known names for an unknown ``builtin:`` name
    (``builtin:../../x`` included: only the shipped names resolve).
    """
    text = str(path)
    if not text.startswith(PREFIX):
        return Path(text)
    name = text[len(PREFIX):]
    found = _PROMPTS / f"{name}.jsonl"
    if name not in builtin_names():  # a name, never a path: builtin:../x is not a file here
        raise ConfigError(f"{text}: no such built-in file; known: "
                          f"{[PREFIX + n for n in builtin_names()]}")
    return found
