"""``specdraft eval``: acceptance of a drafter, offline or from a running server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdraft.cli.options import echo_figures, stage_command
from specdraft.eval.config import EvalConfig


def _echo(m: dict[str, Any], cfg: EvalConfig) -> None:
    echo_figures(m, "eval", cfg.out or Path(cfg.run_dir) / "eval")


command = stage_command(
    EvalConfig, verb="eval", run="specdraft.eval.run:run", echo=_echo,
    help="Speculative decoding over the prompts: tau, acceptance rate, per-position acceptance.")
