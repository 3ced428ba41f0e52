"""``specdraft extract``: capture the verifier's hidden states for the prepared rows."""

from __future__ import annotations

from typing import TYPE_CHECKING


from specdraft.cli.options import echo_figures, stage_command
from specdraft.extract.config import ExtractConfig

if TYPE_CHECKING:
    from specdraft.core.manifest import ExtractManifest


def _echo(manifest: ExtractManifest, cfg: ExtractConfig) -> None:
    from specdraft.artifacts.layout import RunLayout

    echo_figures(manifest, "extract", RunLayout(cfg.run_dir).extract)


command = stage_command(
    ExtractConfig, verb="extract", run="specdraft.extract.run:run", echo=_echo,
    help="Run the verifier over RUN/prepare/dataset and store its hidden states in RUN/extract/.")
