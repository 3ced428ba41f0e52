"""``python -m specdraft.train ...`` (the entry torchrun needs: ``torchrun --nproc-per-node N -m
specdraft.train --run-dir RUN``); the same flags as ``specdraft train``."""

import sys

import typer

from specdraft.cli.train import command
from specdraft.core.errors import SpecdraftError


def main() -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(command)
    try:
        app()
    except SpecdraftError as err:
        print(f"specdraft train: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
