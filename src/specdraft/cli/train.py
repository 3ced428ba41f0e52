"""``specdraft train``: train an EAGLE-3 drafter on ``RUN/extract`` (or online) and ``RUN/vocab``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specdraft.cli.common import CONFIG_OPTION_HELP, build_config


def command(
    run_dir: Optional[Path] = typer.Option(None, help="Run directory (reads extract/, vocab/)."),
    epochs: Optional[int] = typer.Option(None, help="Passes over the training rows [1]."),
    max_steps: Optional[int] = typer.Option(None, help="Stop after this many optimizer steps."),
    ttt_steps: Optional[int] = typer.Option(None, help="Training-time-test steps K [7]."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate [1e-4]."),
    warmup_steps: Optional[int] = typer.Option(None, help="Linear warmup steps [100]."),
    batch_tokens: Optional[int] = typer.Option(None, help="Padded tokens per micro-batch."),
    grad_accum: Optional[int] = typer.Option(None, help="Micro-batches per step per rank [1]."),
    loss: Optional[str] = typer.Option(None, help="soft (CE to the verifier) or hard [soft]."),
    oov_policy: Optional[str] = typer.Option(None, help="mask or keep out-of-draft-vocab labels."),
    attn_impl: Optional[str] = typer.Option(None, help="TTT attention: split or dense [split]."),
    parallel: Optional[str] = typer.Option(None, help="ddp or fsdp under torchrun [ddp]."),
    val_fraction: Optional[float] = typer.Option(None, help="Rows held out for validation."),
    eval_every: Optional[int] = typer.Option(None, help="Validate every N steps [500]."),
    save_every: Optional[int] = typer.Option(None, help="Checkpoint every N steps [500]."),
    seed: Optional[int] = typer.Option(None, help="Seed of init, split and shuffling [0]."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda, cuda:1 (default: auto)."),
    dtype: Optional[str] = typer.Option(None, help="auto (bf16 autocast on GPU), float32, bfloat16."),
    online: Optional[bool] = typer.Option(None, "--online/--offline", help="Run the verifier in the step."),
    verifier: Optional[str] = typer.Option(None, help="Verifier (HF dir, .gguf or smollm2)."),
    resume: Optional[bool] = typer.Option(None, "--resume", help="Continue from the last checkpoint."),
    overwrite: Optional[bool] = typer.Option(None, "--overwrite", help="Delete RUN/train first."),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_OPTION_HELP),
) -> None:
    """Train the drafter (TTT objective); writes RUN/train/{best,last,checkpoints,metrics.jsonl}."""
    flags = {k: v for k, v in locals().items() if k != "config"}
    from specdraft.train.config import TrainConfig

    cfg = build_config(TrainConfig, config_file=config, section="train", flags=flags)
    from specdraft.train.run import run

    manifest = run(cfg)
    best = manifest.get("best_val") or {}
    if manifest.get("world_size", 1) == 1 or int(__import__("os").environ.get("RANK", "0")) == 0:
        typer.echo(f"trained {manifest['steps']} steps; best validation tau {best.get('tau', 0):.3f} "
                   f"(step {manifest.get('best_step')}); {manifest['tokens_per_s']:.0f} tokens/s "
                   f"-> {cfg.run_dir / 'train'}")
