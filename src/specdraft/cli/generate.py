"""``specdraft generate``: regenerate assistant turns with the verifier (see
:mod:`specdraft.generate.run`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from specdraft.cli.common import CONFIG_OPTION_HELP, build_config
from specdraft.core.errors import ConfigError


def _json_flag(name: str, text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"{name}: not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a JSON object, got {type(value).__name__}")
    return value


def _field_flags(items: list[str] | None) -> dict[str, str] | None:
    if not items:
        return None
    out = {}
    for item in items:
        kind, sep, column = item.partition("=")
        if not sep or not kind or not column:
            raise ConfigError(f"--field {item!r}: expected KIND=COLUMN, e.g. question=problem")
        out[kind] = column
    return out


def command(
    prompts: Optional[str] = typer.Option(None, help="Prompt file: .jsonl, .json or .parquet."),
    run_dir: Optional[str] = typer.Option(None, help="Run directory (writes RUN/generate/)."),
    backend: Optional[str] = typer.Option(None, help="openai (a server) or local (default)."),
    endpoint: Optional[list[str]] = typer.Option(None, help="Server base URL; repeat to "
                                                 "spread load over several."),
    model: Optional[str] = typer.Option(None, help="Model name (default: the server's first)."),
    api_key_env: Optional[str] = typer.Option(None, help="Env var holding the API key."),
    verifier: Optional[str] = typer.Option(None, help="local: HF dir, .gguf or 'smollm2'."),
    device: Optional[str] = typer.Option(None, help="local: cpu, cuda, cuda:1, ..."),
    dtype: Optional[str] = typer.Option(None, help="local: auto, float32, bfloat16, float16."),
    batch_size: Optional[int] = typer.Option(None, help="local: prompts per batch."),
    concurrency: Optional[int] = typer.Option(None, help="openai: requests in flight (64)."),
    timeout_s: Optional[float] = typer.Option(None, help="openai: seconds per request."),
    max_retries: Optional[int] = typer.Option(None, help="openai: retries per request (5)."),
    max_tokens: Optional[int] = typer.Option(None, help="Completion tokens per turn (2048)."),
    temperature: Optional[float] = typer.Option(None, help="0 = greedy (default)."),
    top_p: Optional[float] = typer.Option(None),
    seed: Optional[int] = typer.Option(None),
    chat_template_kwargs: Optional[str] = typer.Option(None, help="JSON, e.g. "
                                                       "'{\"enable_thinking\": true}'."),
    extra_body: Optional[str] = typer.Option(None, help="openai: JSON merged into each request."),
    return_token_ids: Optional[bool] = typer.Option(None, "--return-token-ids/"
                                                    "--no-return-token-ids"),
    system_prompt: Optional[str] = typer.Option(None, help="System message for rows without."),
    field: Optional[list[str]] = typer.Option(None, help="KIND=COLUMN input field mapping, "
                                              "e.g. question=problem; repeatable."),
    limit: Optional[int] = typer.Option(None, help="Use the first N prompts only."),
    think_open: Optional[str] = typer.Option(None, help="Reasoning opener tag (<think>)."),
    think_close: Optional[str] = typer.Option(None, help="Reasoning closer tag (</think>)."),
    require_reasoning: Optional[bool] = typer.Option(None, "--require-reasoning",
                                                     help="Reject turns without reasoning."),
    malformed_think: Optional[str] = typer.Option(None, help="reject (default) or keep."),
    keep_truncated: Optional[bool] = typer.Option(None, "--keep-truncated",
                                                  help="Keep answers cut by --max-tokens."),
    resume: Optional[bool] = typer.Option(None, "--resume", help="Continue a partial run."),
    overwrite: Optional[bool] = typer.Option(None, "--overwrite", help="Delete and restart."),
    flush_every: Optional[int] = typer.Option(None, help="Samples per fsynced write batch."),
    progress_interval_s: Optional[float] = typer.Option(None, help="Seconds between lines."),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_OPTION_HELP),
) -> None:
    """Answer every prompt with the verifier: RUN/generate/samples.jsonl + rejects.jsonl."""
    from specdraft.generate.config import GenerateConfig

    flags = dict(locals())
    flags.pop("config")
    flags.pop("GenerateConfig")
    flags["chat_template_kwargs"] = _json_flag("--chat-template-kwargs", chat_template_kwargs)
    flags["extra_body"] = _json_flag("--extra-body", extra_body)
    flags["fields"] = _field_flags(flags.pop("field"))
    cfg = build_config(GenerateConfig, config_file=config, section="generate", flags=flags)
    from specdraft.generate.run import run

    try:
        manifest = run(cfg)
    except KeyboardInterrupt:
        print("generate: interrupted; finished samples are written — rerun with --resume",
              file=sys.stderr)
        raise typer.Exit(130) from None
    c = manifest["counts"]
    typer.echo(f"generate: {c['samples']} samples, rejected {c['rejected'] or 'none'} -> "
               f"{Path(cfg.run_dir) / 'generate'}")
