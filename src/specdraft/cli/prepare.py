"""``specdraft prepare``: conversations -> token rows with exact loss masks (see
:mod:`specdraft.prepare.run`)."""

from __future__ import annotations

from typing import TYPE_CHECKING


import typer

from specdraft.artifacts.prompts import parse_field_pairs
from specdraft.cli.options import echo_figures, stage_command
from specdraft.prepare.config import PrepareConfig

if TYPE_CHECKING:
    from specdraft.core.manifest import PrepareManifest


def _echo(manifest: PrepareManifest, cfg: PrepareConfig) -> None:
    from specdraft.artifacts.layout import RunLayout

    from specdraft.prepare.stats import format_summary

    typer.echo(format_summary(manifest.summary))
    echo_figures(manifest, "prepare", RunLayout(cfg.run_dir).prepare)


command = stage_command(
    PrepareConfig, verb="prepare", run="specdraft.prepare.run:run", echo=_echo,
    names={"fields": ("--field", "--fields")}, parsers={"fields": parse_field_pairs},
    help="Tokenize every supervised assistant turn: RUN/prepare/dataset/ + rejects.jsonl.")
