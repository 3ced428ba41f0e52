"""``specdraft train``: train a drafter of the kind ``--drafter`` names (:mod:`specdraft.kinds`)
on ``RUN/extract`` (or online) and ``RUN/vocab``."""

from __future__ import annotations

import os
from typing import Any

from specdraft.cli.options import echo_figures, stage_command
from specdraft.train.config import TrainConfig


def _echo(manifest: dict[str, Any], cfg: TrainConfig) -> None:
    if manifest.get("world_size", 1) > 1 and int(os.environ.get("RANK", "0")) != 0:
        return
    echo_figures(manifest, "train", cfg.run_dir / "train")


command = stage_command(
    TrainConfig, verb="train", run="specdraft.train.run:run", echo=_echo,
    names={"online": ("--online/--offline",)},
    help="Train the drafter (its kind's objective: EAGLE-3's TTT unroll, DFlash's blocks); "
         "writes RUN/train/{best,last,checkpoints,metrics.jsonl}.")
