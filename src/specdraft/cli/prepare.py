"""``specdraft prepare``: conversations -> token rows with exact loss masks (see
:mod:`specdraft.prepare.run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specdraft.cli.common import CONFIG_OPTION_HELP, build_config


def command(
    run_dir: Optional[str] = typer.Option(None, help="Run directory (writes RUN/prepare/)."),
    verifier: Optional[str] = typer.Option(None, help="HF dir, .gguf or 'smollm2' (default)."),
    tokenizer: Optional[str] = typer.Option(None, help="Tokenizer dir/.gguf instead of the "
                                            "verifier's."),
    data: Optional[str] = typer.Option(None, help="Conversation file (.jsonl/.json/.parquet or "
                                       "a save_to_disk dir) instead of RUN/generate/."),
    turns: Optional[str] = typer.Option(None, help="all (default) or last."),
    max_seq_len: Optional[int] = typer.Option(None, help="Tokens per row (2048)."),
    chat_template: Optional[str] = typer.Option(None, help="Template file overriding the "
                                                "tokenizer's."),
    chat_template_kwargs: Optional[str] = typer.Option(None, help="JSON for records without "
                                                       "their own, e.g. "
                                                       "'{\"enable_thinking\": false}'."),
    think_tokens: Optional[str] = typer.Option(None, help="OPEN,CLOSE (default: <think>,"
                                               "</think> when single tokens)."),
    stop_tokens: Optional[str] = typer.Option(None, help="End-of-turn token(s), comma-separated "
                                              "(default: detected from the template)."),
    reasoning_format: Optional[str] = typer.Option(None, help="Join of reasoning and closer "
                                                   "when the prompt ends with the opener."),
    require_reasoning: Optional[bool] = typer.Option(None, "--require-reasoning",
                                                     help="Reject turns without reasoning."),
    add_special_tokens: Optional[bool] = typer.Option(None, "--add-special-tokens",
                                                      help="Let the tokenizer add BOS etc."),
    trust_remote_code: Optional[bool] = typer.Option(None, "--trust-remote-code"),
    resume: Optional[bool] = typer.Option(None, "--resume", help="Run again over RUN/prepare."),
    overwrite: Optional[bool] = typer.Option(None, "--overwrite", help="Delete and restart."),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_OPTION_HELP),
) -> None:
    """Tokenize every supervised assistant turn: RUN/prepare/dataset/ + rejects.jsonl."""
    from specdraft.prepare.config import PrepareConfig

    flags = dict(locals())
    flags.pop("config")
    flags.pop("PrepareConfig")
    cfg = build_config(PrepareConfig, config_file=config, section="prepare", flags=flags)
    from specdraft.prepare.run import run
    from specdraft.prepare.stats import format_summary

    manifest = run(cfg)
    typer.echo(format_summary(manifest["summary"]))
    typer.echo(f"prepare: {manifest['counts']['out']} rows -> {Path(cfg.run_dir) / 'prepare'}")
