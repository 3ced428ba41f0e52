"""``specdraft generate``: regenerate assistant turns with the verifier (see
:mod:`specdraft.generate.run`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from specdraft.cli.options import echo_figures, stage_command
from specdraft.artifacts.prompts import parse_field_pairs
from specdraft.generate.config import GenerateConfig


def _run(cfg: GenerateConfig) -> dict[str, Any]:
    from specdraft.generate.run import run

    try:
        return run(cfg)
    except KeyboardInterrupt:
        print("generate: interrupted; finished samples are written — rerun with --resume",
              file=sys.stderr)
        raise typer.Exit(130) from None


def _echo(manifest: dict[str, Any], cfg: GenerateConfig) -> None:
    echo_figures(manifest, "generate", Path(cfg.run_dir) / "generate")


command = stage_command(
    GenerateConfig, verb="generate", run=_run, echo=_echo,
    names={"fields": ("--field", "--fields")}, parsers={"fields": parse_field_pairs},
    help="Answer every prompt with the verifier: RUN/generate/samples.jsonl + rejects.jsonl.")
