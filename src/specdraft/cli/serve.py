"""``specdraft serve``: the run's verifier in vLLM's OpenAI server, generating and capturing
hidden states (for ``generate --backend openai`` and ``extract --endpoint``), in the
foreground until Ctrl-C."""

from __future__ import annotations

from typing import Any

from specdraft.cli.options import stage_command
from specdraft.engines.live_config import ServeConfig


def _echo(rc: Any, cfg: ServeConfig) -> None:
    """Nothing more to say: :func:`specdraft.engines.live.serve` printed the URL and command."""


command = stage_command(
    ServeConfig, verb="serve", run="specdraft.engines.live:serve", echo=_echo,
    help="Serve the run's verifier with vLLM (OpenAI API), hidden-state capture on: one server "
         "for generate and extract --endpoint.")
