"""``specdraft train``: train a drafter of the kind ``--drafter`` names (:mod:`specdraft.kinds`)
on ``RUN/extract`` (or online) and ``RUN/vocab``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from specdraft.cli.options import echo_figures, stage_command
from specdraft.train.config import TrainConfig

if TYPE_CHECKING:
    from specdraft.core.manifest import TrainManifest


def _echo(manifest: TrainManifest, cfg: TrainConfig) -> None:
    from specdraft.artifacts.layout import RunLayout

    if manifest.world_size > 1 and int(os.environ.get("RANK", "0")) != 0:
        return
    echo_figures(manifest, "train", RunLayout(cfg.run_dir).train)


def _run(cfg: TrainConfig) -> TrainManifest:
    """``train``; with ``--endpoint`` the live source (:mod:`specdraft.extract.live_source`)
    handed to the stage (composed here: the train stage does not import extract)."""
    from specdraft.train.run import run

    if not cfg.endpoint:
        return run(cfg)
    from specdraft.extract.live_source import open_live_source

    return run(cfg, source=open_live_source)


command = stage_command(
    TrainConfig, verb="train", run=_run, echo=_echo,
    names={"online": ("--online/--offline",)},
    help="Train the drafter (its kind's objective: EAGLE-3's TTT unroll, DFlash's blocks); "
         "writes RUN/train/{best,last,checkpoints,metrics.jsonl}.")
