"""``specdraft export``: write a trained drafter for vLLM, SGLang or speculators."""

from __future__ import annotations

from typing import TYPE_CHECKING


from specdraft.cli.options import echo_figures, stage_command
from specdraft.export.config import ExportConfig

if TYPE_CHECKING:
    from specdraft.core.manifest import ExportManifest


def _echo(m: ExportManifest, cfg: ExportConfig) -> None:
    echo_figures(m, "export")


command = stage_command(
    ExportConfig, verb="export", run="specdraft.export.run:run", echo=_echo,
    help="Validate the trained drafter against the format's manifest, then write it (or refuse, "
         "listing every problem).")
