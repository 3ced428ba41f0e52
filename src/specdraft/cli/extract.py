"""``specdraft extract``: capture the verifier's hidden states for the prepared rows."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specdraft.cli.common import CONFIG_OPTION_HELP, build_config


def command(
    run_dir: Optional[Path] = typer.Option(None, help="Run directory (reads RUN/prepare/)."),
    verifier: Optional[str] = typer.Option(None, help="HF model dir, .gguf file or 'smollm2'."),
    aux_layers: Optional[str] = typer.Option(
        None, help="Comma-separated aux ids (id i = input to decoder layer i); "
                   "default 2,N//2,N-3."),
    batch_tokens: Optional[int] = typer.Option(None, help="Padded tokens per forward."),
    storage: Optional[str] = typer.Option(None, help="fp32 | bf16 | fp8 | bf16-zstd | fp8-zstd."),
    zstd_level: Optional[int] = typer.Option(None, help="Zstandard level for *-zstd storage."),
    shard_mb: Optional[float] = typer.Option(None, help="Max uncompressed MiB per shard."),
    verify: Optional[int] = typer.Option(None, help="Recompute N random rows and compare."),
    seed: Optional[int] = typer.Option(None, help="Seed of the --verify sample."),
    dtype: Optional[str] = typer.Option(None, help="auto | float32 | bfloat16."),
    device: Optional[str] = typer.Option(None, help="auto | cpu | cuda[:N]."),
    device_map: Optional[str] = typer.Option(None, help="e.g. auto: spread a large verifier."),
    trust_remote_code: Optional[bool] = typer.Option(None, "--trust-remote-code",
                                                     help="Allow the verifier's own code."),
    backend: Optional[str] = typer.Option(
        None, help="transformers | vllm (a vLLM engine in its own venv, same artifacts)."),
    tensor_parallel_size: Optional[int] = typer.Option(None, help="vLLM: TP per engine replica."),
    pipeline_parallel_size: Optional[int] = typer.Option(None,
                                                         help="vLLM: PP per engine replica."),
    engine_args: Optional[str] = typer.Option(
        None, help='vLLM: JSON object of extra vllm.LLM arguments, e.g. {"max_num_seqs": 64}.'),
    engine_python: Optional[str] = typer.Option(
        None, help="vLLM: python with vllm [env SPECDRAFT_VLLM_PYTHON, else REPO/.venv-vllm]."),
    resume: Optional[bool] = typer.Option(None, "--resume", help="Continue a killed run."),
    overwrite: Optional[bool] = typer.Option(None, "--overwrite", help="Delete and restart."),
    config: Optional[Path] = typer.Option(None, help=CONFIG_OPTION_HELP),
) -> None:
    """Run the verifier over RUN/prepare/dataset and store its hidden states in RUN/extract/."""
    from specdraft.extract.config import ExtractConfig

    flags = {k: v for k, v in locals().items() if k not in ("config", "ExtractConfig")}
    cfg = build_config(ExtractConfig, config_file=config, section="extract", flags=flags)
    from specdraft.extract.run import run

    manifest = run(cfg)
    st, counts = manifest["storage"], manifest["counts"]
    verified = manifest.get("verify")
    typer.echo(f"extract: {counts['rows_out']} rows, {counts['tokens']} tokens, aux ids "
               f"{manifest['aux_layer_ids']}, {st['shards']} shards, {st['bytes_total']} bytes "
               f"({st['bytes_per_token']} B/token = {st['bytes_per_token_over_8H']} x 8H)"
               + (f", verify {'ok' if verified['ok'] else 'FAILED'} (max err/bound "
                  f"{verified['max_err_over_bound']:.3g})" if verified else ""))
