"""``specdraft extract``: capture the verifier's hidden states for the prepared rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdraft.cli.options import echo_figures, stage_command
from specdraft.extract.config import ExtractConfig


def _echo(manifest: dict[str, Any], cfg: ExtractConfig) -> None:
    echo_figures(manifest, "extract", Path(cfg.run_dir) / "extract")


command = stage_command(
    ExtractConfig, verb="extract", run="specdraft.extract.run:run", echo=_echo,
    help="Run the verifier over RUN/prepare/dataset and store its hidden states in RUN/extract/.")
