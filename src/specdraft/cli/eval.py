"""``specdraft eval``: acceptance of a drafter, offline or from a running server."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specdraft.cli.common import CONFIG_OPTION_HELP, build_config


def command(
    run_dir: Optional[Path] = typer.Option(None, help="Run directory (RUN/train/best -> "
                                                      "RUN/eval/)."),
    drafter: Optional[Path] = typer.Option(None, help="Drafter dir (specdraft or exported)."),
    verifier: Optional[str] = typer.Option(None, help="HF model dir, .gguf file or 'smollm2'."),
    prompts: Optional[Path] = typer.Option(None, help="Any prompt file generate reads "
                                                      "(first user turn), or builtin:NAME."),
    k: Optional[int] = typer.Option(None, help="Drafts per verify step (default 4)."),
    temperature: Optional[float] = typer.Option(None, help="0 = greedy; > 0 = speculative "
                                                           "sampling."),
    max_new_tokens: Optional[int] = typer.Option(None, help="New tokens per prompt."),
    limit: Optional[int] = typer.Option(None, help="Use the first N prompts."),
    seed: Optional[int] = typer.Option(None, help="Sampling seed."),
    device: Optional[str] = typer.Option(None, help="cpu | cuda[:N]."),
    dtype: Optional[str] = typer.Option(None, help="auto | float32 | bfloat16."),
    server: Optional[str] = typer.Option(None, help="URL of a vLLM/SGLang with the drafter "
                                                    "loaded."),
    engine: Optional[str] = typer.Option(None, help="none | auto | vllm | sglang: also measure "
                                                    "with that engine, started for the eval "
                                                    "(auto: vllm if found)."),
    engine_python: Optional[str] = typer.Option(None, help="Python with vLLM (default: env "
                                                           "SPECDRAFT_VLLM_PYTHON, this one, "
                                                           "or REPO/.venv-vllm)."),
    engine_drafter: Optional[Path] = typer.Option(None, help="Exported dir the engine loads "
                                                             "(default: the run's export)."),
    engine_tolerance: Optional[float] = typer.Option(None, help="Max |tau offline - engine| "
                                                                "at T=0 (default 0.05)."),
    out: Optional[Path] = typer.Option(None, help="Output dir when no --run-dir."),
    overwrite: Optional[bool] = typer.Option(None, "--overwrite", help="Replace earlier results."),
    config: Optional[Path] = typer.Option(None, help=CONFIG_OPTION_HELP),
) -> None:
    """Speculative decoding over the prompts: tau, acceptance rate, per-position acceptance."""
    from specdraft.eval.config import EvalConfig

    flags = {k_: v for k_, v in locals().items() if k_ not in ("config", "EvalConfig")}
    cfg = build_config(EvalConfig, config_file=config, section="eval", flags=flags)
    from specdraft.eval.run import run

    m = run(cfg)
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
