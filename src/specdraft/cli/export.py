"""``specdraft export``: write a trained drafter for vLLM, SGLang or speculators."""

from __future__ import annotations

from typing import Any

import typer

from specdraft.cli.options import stage_command
from specdraft.export.config import ExportConfig


def _echo(m: dict[str, Any], cfg: ExportConfig) -> None:
    typer.echo(f"export: {m['format']} -> {m['out']} ({m['counts']['tensors']} tensors, aux ids "
               f"{m['engine_aux_ids']}, embed_tokens: {m['embed_tokens']})")


command = stage_command(
    ExportConfig, verb="export", run="specdraft.export.run:run", echo=_echo,
    help="Validate the trained drafter against the format's manifest, then write it (or refuse, "
         "listing every problem).")
