"""The ``specdraft`` command line: one sub-command per stage, each in ``cli/<verb>.py``.

A verb's options are generated from its stage config's fields (:mod:`specdraft.cli.options`;
``--config FILE.yaml`` takes the same names), the verb builds the stage's frozen config and calls
``specdraft.<stage>.run.run(config)``. No stage logic and no torch import here: ``specdraft
--help`` stays fast. ``python -m specdraft.cli._surface`` prints every verb's options (the golden
``tests/cli/cli_surface.txt``).
"""

from __future__ import annotations

import errno
import sys

import typer

from specdraft.core.errors import SpecdraftError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Train EAGLE-3 and DFlash draft models for speculative decoding, end to "
                       "end.")

# Implemented verbs, in pipeline order: import the verb module, register its `command`.
# (Each stage adds its own two lines here.)
from specdraft.cli import generate as _generate  # noqa: E402
app.command("generate")(_generate.command)
from specdraft.cli import prepare as _prepare  # noqa: E402
app.command("prepare")(_prepare.command)
from specdraft.cli import vocab as _vocab  # noqa: E402
app.command("vocab")(_vocab.command)
from specdraft.cli import extract as _extract  # noqa: E402
app.command("extract")(_extract.command)
from specdraft.cli import train as _train  # noqa: E402
app.command("train")(_train.command)
from specdraft.cli import export as _export  # noqa: E402
app.command("export")(_export.command)
from specdraft.cli import eval as _eval  # noqa: E402
app.command("eval")(_eval.command)
from specdraft.cli import doctor as _doctor  # noqa: E402
app.command("doctor")(_doctor.command)
from specdraft.cli import serve as _serve  # noqa: E402
app.command("serve")(_serve.command)
from specdraft.cli import run as _run  # noqa: E402
app.command("run")(_run.command)


@app.callback()
def _root() -> None:
    """Train EAGLE-3 and DFlash draft models for speculative decoding, end to end."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``specdraft`` script (``argv`` defaults to ``sys.argv[1:]``).

    Every user-facing failure ends here as ``specdraft: error: MESSAGE`` on stderr and exit
    code 2, never a traceback: the specdraft error types (:class:`SpecdraftError`:
    ``ConfigError``, ``InputError``, ``StageDirError``, ``ExportRefused``, ...) and an
    :class:`OSError` (disk full, read-only or missing directory, permission), which is named
    with its errno and file. Nothing half-written is left under a final name: artifacts are
    written atomically (:mod:`specdraft.core.atomic`), so a rerun with ``--resume`` continues.
    """
    from specdraft.core.progress import quiet_library_bars

    quiet_library_bars()  # off a terminal: no \r-drawn library bars in the log
    try:
        app(args=argv, prog_name="specdraft")
    except SpecdraftError as err:
        _fail(str(err))
    except OSError as err:
        _fail(os_error_message(err))


def os_error_message(err: OSError) -> str:
    """``[Errno 28] No space left on device: 'RUN/extract/shards/…'`` plus what to do."""
    what = err.strerror or str(err)
    where = f": {err.filename}" if err.filename else ""
    name = errno.errorcode.get(err.errno or 0, "")
    hint = {"ENOSPC": "free space (or use another --run-dir), then rerun with --resume",
            "EDQUOT": "free space (or use another --run-dir), then rerun with --resume",
            "EROFS": "the run directory is read-only; use a writable --run-dir",
            "EACCES": "no permission; check the owner and mode of the file or directory"}.get(name)
    return f"{what}{f' ({name})' if name else ''}{where}" + (f"; {hint}" if hint else "")


def _fail(message: str) -> None:
    print(f"specdraft: error: {message}", file=sys.stderr)
    sys.exit(2)
