"""``specdraft train``: train an EAGLE-3 drafter on ``RUN/extract`` (or online) and ``RUN/vocab``."""

from __future__ import annotations

import os
from typing import Any

import typer

from specdraft.cli.options import stage_command
from specdraft.train.config import TrainConfig


def _echo(manifest: dict[str, Any], cfg: TrainConfig) -> None:
    if manifest.get("world_size", 1) > 1 and int(os.environ.get("RANK", "0")) != 0:
        return
    best = manifest.get("best_val") or {}
    typer.echo(f"trained {manifest['steps']} steps; best validation tau {best.get('tau', 0):.3f} "
               f"(step {manifest.get('best_step')}); {manifest['tokens_per_s']:.0f} tokens/s "
               f"-> {cfg.run_dir / 'train'}")


command = stage_command(
    TrainConfig, verb="train", run="specdraft.train.run:run", echo=_echo,
    names={"online": ("--online/--offline",)},
    help="Train the drafter (TTT objective); writes RUN/train/{best,last,checkpoints,"
         "metrics.jsonl}.")
