"""``specdraft eval``: acceptance of a drafter, offline or from a running server."""

from __future__ import annotations

from typing import Any

import typer

from specdraft.cli.options import stage_command
from specdraft.eval.config import EvalConfig


def _echo(m: dict[str, Any], cfg: EvalConfig) -> None:
    rates = ", ".join(f"{r:.2f}" for r in m.get("per_position") or [])
    typer.echo(f"eval: tau {m['tau']:.3f}, acceptance {m['acceptance_rate'] or 0:.3f}, "
               f"per position [{rates}], {m['tokens_per_s'] or 0:.1f} tokens/s")
    e = m.get("engine")
    if e:
        rates = ", ".join(f"{r:.2f}" for r in e.get("per_position") or [])
        gap = e.get("tau_offline_minus_engine")
        typer.echo(f"eval: {e['version']}: tau {e['tau']:.3f}, acceptance "
                   f"{e['acceptance_rate'] or 0:.3f}, per position [{rates}]"
                   + (f"; offline - engine {gap:+.3f}, identical prompts "
                      f"{e['identical_prompts']}" if gap is not None else ""))


command = stage_command(
    EvalConfig, verb="eval", run="specdraft.eval.run:run", echo=_echo,
    help="Speculative decoding over the prompts: tau, acceptance rate, per-position acceptance.")
