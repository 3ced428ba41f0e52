"""``specdraft run CONFIG.yaml``: the whole job (see :mod:`specdraft.pipeline.run`)."""

from __future__ import annotations

from typing import Optional

import typer


def command(
    config: Optional[str] = typer.Argument(None, help="Pipeline YAML (see --dump-config)."),
    from_stage: Optional[str] = typer.Option(None, "--from", help="Start at this stage "
                                             "(earlier ones are left as they are)."),
    until: Optional[str] = typer.Option(None, help="Stop after this stage."),
    run_dir: Optional[str] = typer.Option(None, help="Override the YAML's run_dir."),
    dump_config: bool = typer.Option(False, "--dump-config",
                                     help="Print a commented default config and exit."),
) -> None:
    """Run every stage in order; complete stages are skipped, interrupted ones resumed."""
    if dump_config:
        from specdraft.pipeline.dump import dump_default_config

        typer.echo(dump_default_config(), nl=False)
        return
    if config is None:
        raise typer.BadParameter("give a CONFIG.yaml (or --dump-config)")
    from specdraft.pipeline.config import PipelineConfig
    from specdraft.pipeline.run import run, select_stages

    selected = [spec.name for spec in select_stages(from_stage, until)]
    run(PipelineConfig.from_yaml(config, run_dir=run_dir, selected=selected),
        from_stage=from_stage, until=until)
