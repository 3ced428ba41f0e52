"""``specdraft export``: write a trained drafter for vLLM, SGLang or speculators."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specdraft.cli.common import CONFIG_OPTION_HELP, build_config


def command(
    run_dir: Optional[Path] = typer.Option(None, help="Run directory (reads RUN/train/best, "
                                                      "RUN/extract/)."),
    drafter: Optional[Path] = typer.Option(None, help="A drafter directory instead of "
                                                      "RUN/train/best."),
    format: Optional[str] = typer.Option(None, help="sglang (default; loads in vLLM too) | "
                                                    "vllm | speculators."),
    out: Optional[Path] = typer.Option(None, help="Output directory (default RUN/export/FORMAT)."),
    verifier: Optional[str] = typer.Option(None, help="Verifier (HF dir, .gguf, 'smollm2'): "
                                                      "layer count, embedding."),
    verifier_name: Optional[str] = typer.Option(None, help="speculators verifier.name_or_path."),
    embed: Optional[str] = typer.Option(None, help="auto | copy | omit the verifier's embedding."),
    speculative_tokens: Optional[int] = typer.Option(None, help="speculators proposal k."),
    dtype: Optional[str] = typer.Option(None, help="auto | float32 | bfloat16 | float16."),
    aux_layers: Optional[str] = typer.Option(None, help="Aux ids used at extraction (e.g. 2,15,27)"
                                             " when RUN/extract/manifest.json does not say."),
    overwrite: Optional[bool] = typer.Option(None, "--overwrite", help="Replace the output."),
    config: Optional[Path] = typer.Option(None, help=CONFIG_OPTION_HELP),
) -> None:
    """Validate the trained drafter against the format's manifest, then write it (or refuse,
    listing every problem)."""
    from specdraft.export.config import ExportConfig

    flags = {k: v for k, v in locals().items() if k not in ("config", "ExportConfig")}
    cfg = build_config(ExportConfig, config_file=config, section="export", flags=flags)
    from specdraft.export.run import run

    m = run(cfg)
    typer.echo(f"export: {m['format']} -> {m['out']} ({m['counts']['tensors']} tensors, aux ids "
               f"{m['engine_aux_ids']}, embed_tokens: {m['embed_tokens']})")
