"""``specdraft extract``: capture the verifier's hidden states for the prepared rows."""

from __future__ import annotations

from typing import Any

import typer

from specdraft.cli.options import stage_command
from specdraft.extract.config import ExtractConfig


def _echo(manifest: dict[str, Any], cfg: ExtractConfig) -> None:
    st, counts = manifest["storage"], manifest["counts"]
    verified = manifest.get("verify")
    typer.echo(f"extract: {counts['rows_out']} rows, {counts['tokens']} tokens, aux ids "
               f"{manifest['aux_layer_ids']}, {st['shards']} shards, {st['bytes_total']} bytes "
               f"({st['bytes_per_token']} B/token = {st['bytes_per_token_over_8H']} x 8H)"
               + (f", verify {'ok' if verified['ok'] else 'FAILED'} (max err/bound "
                  f"{verified['max_err_over_bound']:.3g})" if verified else ""))


command = stage_command(
    ExtractConfig, verb="extract", run="specdraft.extract.run:run", echo=_echo,
    help="Run the verifier over RUN/prepare/dataset and store its hidden states in RUN/extract/.")
