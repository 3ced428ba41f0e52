"""``specdraft doctor RUN|DIR --verifier PATH``: pass/fail checks with fixes; exit 1 on failure."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from specdraft.cli.options import stage_command
from specdraft.doctor.config import DoctorConfig

if TYPE_CHECKING:
    from specdraft.doctor.run import DoctorReport


def _echo(report: DoctorReport, cfg: DoctorConfig) -> None:
    typer.echo(f"doctor: {report.drafter} ({report.format})")
    for c in report.checks:
        status = {"pass": "PASS", "fail": "FAIL", "not run": "NOT RUN"}[
            c.get("status", "pass" if c["ok"] else "fail")]
        typer.echo(f"  [{status}] {c['name']}: {c['detail']}")
        if not c["ok"]:
            typer.echo(f"         fix: {c['fix']}")
    for fix in report.engine_fixes:  # a patched engine is always said
        typer.echo(f"  [NOTE] the run's engine figures (RUN/eval) needed a fix to the CPU "
                   f"engine: {fix}")
    if not report.ok:
        raise typer.Exit(1)


command = stage_command(
    DoctorConfig, verb="doctor", run="specdraft.doctor.run:run", echo=_echo,
    arguments=("target",),
    help="Check a drafter against its verifier and the engines' loading rules.")
