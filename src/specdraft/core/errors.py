"""Errors that the CLI reports as one clear message (no traceback) and exit code 2."""


class SpecdraftError(Exception):
    """Base of user-facing errors: the message names the file, line, sample id or flag."""


class ConfigError(SpecdraftError, ValueError):
    """A config value is wrong; the message names the flag (and file) to change."""


class InputError(SpecdraftError, ValueError):
    """Bad input data; the message names the file and line, or the sample id."""


class StageDirError(SpecdraftError, RuntimeError):
    """A stage directory is in a state the command refuses to touch (e.g. would clobber)."""


def clip(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (with ``…``): a value from a user file named in
    an error message, without echoing a megabyte of it."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"
