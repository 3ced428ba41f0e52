"""``specdraft generate``: regenerate assistant turns with the verifier (see
:mod:`specdraft.generate.run`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from specdraft.cli.options import echo_figures, stage_command
from specdraft.artifacts.prompts import parse_field_pairs
from specdraft.generate.config import GenerateConfig

if TYPE_CHECKING:
    from specdraft.core.manifest import GenerateManifest


def _run(cfg: GenerateConfig) -> GenerateManifest:
    from specdraft.generate.run import run

    try:
        return run(cfg)
    except KeyboardInterrupt:
        print("generate: interrupted; finished samples are written — rerun with --resume",
              file=sys.stderr)
        raise typer.Exit(130) from None


def _echo(manifest: GenerateManifest, cfg: GenerateConfig) -> None:
    from specdraft.artifacts.layout import RunLayout

    echo_figures(manifest, "generate", RunLayout(cfg.run_dir).generate)


command = stage_command(
    GenerateConfig, verb="generate", run=_run, echo=_echo,
    names={"fields": ("--field", "--fields")}, parsers={"fields": parse_field_pairs},
    help="Answer every prompt with the verifier: RUN/generate/samples.jsonl + rejects.jsonl.")
