"""The closing summary of ``specdraft run``: key figures per stage and how to serve the drafter.

Each stage's line is its typed manifest's ``figures()`` (:mod:`specdraft.core.manifest`), the
same line the stage's CLI verb prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdraft.core.manifest import ExportManifest, Manifest

def format_summary(config: Any, manifests: dict[str, Manifest | None]) -> str:
    """A plain-text block: one line per stage (elapsed seconds and key figures), then serving."""
    lines = [f"specdraft run summary ({config.run_dir})"]
    for name, manifest in manifests.items():
        if manifest is None:
            lines.append(f"  {name:<9} not run")
            continue
        lines.append(f"  {name:<9} {manifest.elapsed_s:>7.1f}s  {manifest.figures()}")
    export = manifests.get("export")
    if isinstance(export, ExportManifest):
        verifier = serve_verifier(config.run_dir, config.verifier)
        out = str(Path(export.out).resolve())
        lines += _serve_lines(config.stages.get("eval"), manifests.get("eval"), out, verifier,
                              export.format)
    return "\n".join(lines)


def serve_verifier(run_dir: str | Path, verifier: str) -> str:
    """The verifier an engine serves (:func:`specdraft.engines.serve.served_verifier`)."""
    from specdraft.engines.serve import served_verifier

    return served_verifier(run_dir, verifier)


def _serve_lines(eval_config: Any, eval_manifest: Manifest | None, out: str,
                 verifier: str, fmt: str) -> list[str]:
    """How to serve: the serve plan's best setting when eval ran a --sweep, else the setting
    eval measured (a chain of k, or its SGLang tree)."""
    from specdraft.eval.shapes import Setting

    plan = getattr(eval_manifest, "serve_plan", None)
    if plan:
        b = plan["best_setting"]
        setting = Setting(b["steps"], b["topk"], b["num_draft_tokens"])
        head = (f"Serve the drafter (the serve plan's best setting, {setting.label}, predicted "
                f"speedup {plan['settings'][plan['best']]['predicted_speedup']:.2f}x):")
    else:
        setting = Setting(getattr(eval_config, "k", 3), getattr(eval_config, "topk", 1),
                          getattr(eval_config, "num_draft_tokens", None))
        head = f"Serve the drafter ({setting.label}, as evaluated):"
    commands = setting.serve_commands(out, verifier, fmt)
    if not commands:
        return [head, f"  no engine serves it: a tree needs SGLang, which loads only "
                      f"--format sglang exports (docs/drafters.md)"]
    fixes = ((getattr(eval_manifest, "engine", None) or {}).get("engine_fixes") or [])
    note = ([f"  # the engine figure above needed specdraft's fix(es) to the engine, which "
             f"this plain command does not apply: {'; '.join(f[:80] for f in fixes)}"]
            if fixes else [])
    return [head] + note + [f"  {c}" for c in commands]
