"""``specdraft eval``: acceptance of a drafter, offline or from a running server."""

from __future__ import annotations

from typing import TYPE_CHECKING


from specdraft.cli.options import echo_figures, stage_command
from specdraft.eval.config import EvalConfig

if TYPE_CHECKING:
    from specdraft.core.manifest import EvalManifest


def _echo(m: EvalManifest, cfg: EvalConfig) -> None:
    from specdraft.artifacts.layout import RunLayout

    echo_figures(m, "eval", cfg.out or RunLayout(cfg.run_dir).eval)


command = stage_command(
    EvalConfig, verb="eval", run="specdraft.eval.run:run", echo=_echo,
    help="Speculative decoding over the prompts: tau, acceptance rate, per-position acceptance.")
