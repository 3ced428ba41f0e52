"""``specdraft doctor RUN|DIR --verifier PATH``: pass/fail checks with fixes; exit 1 on failure."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specdraft.cli.common import CONFIG_OPTION_HELP, build_config


def command(
    target: Path = typer.Argument(..., help="Run directory or drafter directory."),
    verifier: Optional[str] = typer.Option(None, help="HF model dir, .gguf file or 'smollm2'."),
    dtype: Optional[str] = typer.Option(None, help="auto | float32 | bfloat16."),
    config: Optional[Path] = typer.Option(None, help=CONFIG_OPTION_HELP),
) -> None:
    """Check a drafter against its verifier and the engines' loading rules."""
    from specdraft.doctor.config import DoctorConfig

    flags = {k: v for k, v in locals().items() if k not in ("config", "DoctorConfig")}
    cfg = build_config(DoctorConfig, config_file=config, section="doctor", flags=flags)
    from specdraft.doctor.run import run

    report = run(cfg)
    typer.echo(f"doctor: {report['drafter']} ({report['format']})")
    for c in report["checks"]:
        typer.echo(f"  [{'PASS' if c['ok'] else 'FAIL'}] {c['name']}: {c['detail']}")
        if not c["ok"]:
            typer.echo(f"         fix: {c['fix']}")
    if not report["ok"]:
        raise typer.Exit(1)
