"""``specdraft vocab``: the draft vocabulary (see :mod:`specdraft.vocab.run`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from specdraft.cli.options import echo_figures, stage_command
from specdraft.vocab.config import VocabConfig

if TYPE_CHECKING:
    from specdraft.core.manifest import VocabManifest


def _echo(manifest: VocabManifest, cfg: VocabConfig) -> None:
    from specdraft.artifacts.vocab_map import vocab_map_path

    echo_figures(manifest, "vocab")
    for t in manifest.vocab.top_left_out[:10]:
        typer.echo(f"  left out: id {t['id']} {t['token'] or ''!r} x{t['count']}")
    typer.echo(f"vocab: -> {vocab_map_path(Path(cfg.run_dir))}")


command = stage_command(
    VocabConfig, verb="vocab", run="specdraft.vocab.run:run", echo=_echo,
    help="Pick the K most frequent supervised tokens: RUN/vocab/vocab_map.safetensors.")
