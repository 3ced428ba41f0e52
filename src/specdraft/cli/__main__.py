"""``python -m specdraft.cli …`` (e.g. under ``torchrun``) is the ``specdraft`` command."""

from specdraft.cli import main

main()
