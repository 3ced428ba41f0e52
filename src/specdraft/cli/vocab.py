"""``specdraft vocab``: the draft vocabulary (see :mod:`specdraft.vocab.run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specdraft.cli.common import CONFIG_OPTION_HELP, build_config


def command(
    run_dir: Optional[str] = typer.Option(None, help="Run directory (reads RUN/prepare/)."),
    draft_vocab_size: Optional[int] = typer.Option(None, help="K, draft vocabulary (32000)."),
    verifier_vocab_size: Optional[int] = typer.Option(None, help="V (default: from prepare)."),
    include_byte_fallback: Optional[bool] = typer.Option(
        None, "--include-byte-fallback/--no-include-byte-fallback",
        help="Always keep <0x00>..<0xFF> byte tokens (default on)."),
    report_left_out: Optional[int] = typer.Option(None, help="Excluded tokens to list (20)."),
    resume: Optional[bool] = typer.Option(None, "--resume", help="Run again over RUN/vocab."),
    overwrite: Optional[bool] = typer.Option(None, "--overwrite", help="Delete and restart."),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_OPTION_HELP),
) -> None:
    """Pick the K most frequent supervised tokens: RUN/vocab/vocab_map.safetensors."""
    from specdraft.vocab.config import VocabConfig

    flags = dict(locals())
    flags.pop("config")
    flags.pop("VocabConfig")
    cfg = build_config(VocabConfig, config_file=config, section="vocab", flags=flags)
    from specdraft.vocab.run import run

    report = run(cfg)["vocab"]
    typer.echo(f"vocab: K={report['draft_vocab_size']} of V={report['verifier_vocab_size']}; "
               f"coverage {100 * report['coverage']:.2f}% of {report['supervised_tokens']} "
               f"supervised tokens ({report['distinct_supervised']} distinct)")
    for t in report["top_left_out"][:10]:
        typer.echo(f"  left out: id {t['id']} {t['token'] or ''!r} x{t['count']}")
    typer.echo(f"vocab: -> {Path(cfg.run_dir) / 'vocab' / 'vocab_map.safetensors'}")
