"""The ``specdraft`` command line: one sub-command per stage, each in ``cli/<verb>.py``.

A verb's options are generated from its stage config's fields (:mod:`specdraft.cli.options`;
``--config FILE.yaml`` takes the same names), the verb builds the stage's frozen config and calls
``specdraft.<stage>.run.run(config)``. No stage logic and no torch import here: ``specdraft
--help`` stays fast. ``python -m specdraft.cli._surface`` prints every verb's options (the golden
``tests/cli/cli_surface.txt``).
"""

from __future__ import annotations

import sys

import typer

from specdraft.core.errors import SpecdraftError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Train EAGLE-3 draft models for speculative decoding, end to end.")

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
from specdraft.cli import run as _run  # noqa: E402
app.command("run")(_run.command)


@app.callback()
def _root() -> None:
    """Train EAGLE-3 draft models for speculative decoding, end to end."""


def main() -> None:
    """Entry point of the ``specdraft`` script: user errors print one message and exit 2."""
    try:
        app()
    except SpecdraftError as err:
        print(f"specdraft: error: {err}", file=sys.stderr)
        sys.exit(2)
