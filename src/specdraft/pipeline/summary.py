"""The closing summary of ``specdraft run``: key figures per stage and how to serve the drafter.

Each stage's line is its typed manifest's ``figures()`` (:mod:`specdraft.core.manifest`), the
same line the stage's CLI verb prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdraft.core.manifest import ExportManifest, Manifest

def format_summary(config: Any, manifests: dict[str, Manifest | None],
                   total_s: float | None = None) -> str:
    """A plain-text block: one line per stage (elapsed seconds and key figures), the total time
    (the stages' seconds summed, and ``total_s``, this invocation's wall time, when given),
    then how to serve the drafter."""
    lines = [f"specdraft run summary ({config.run_dir})"]
    for name, manifest in manifests.items():
        if manifest is None:
            lines.append(f"  {name:<9} not run")
            continue
        lines.append(f"  {name:<9} {manifest.elapsed_s:>7.1f}s  {manifest.figures()}")
    lines.append(total_line(manifests, total_s))
    export = manifests.get("export")
    if isinstance(export, ExportManifest):
        verifier = serve_verifier(config.run_dir, config.verifier)
        out = str(Path(export.out).resolve())
        lines += _serve_lines(config.stages.get("eval"), manifests.get("eval"), out, verifier,
                              export.format, run_dir=config.run_dir, given=config.verifier)
    return "\n".join(lines)


def total_line(manifests: dict[str, Manifest | None], total_s: float | None) -> str:
    """``  total     2105.3s  (35m05s) over the 7 stages; this run 61.2s (the others were
    complete)``: the stages' elapsed seconds summed (each stage's manifest: the time of the
    run that completed it), and this invocation's wall time when given."""
    from specdraft.core.progress import human_seconds

    done = [m.elapsed_s for m in manifests.values() if m is not None]
    line = f"  {'total':<9} {sum(done):>7.1f}s  ({human_seconds(sum(done))}) over the " \
           f"{len(done)} stage{'s' if len(done) != 1 else ''}"
    if total_s is not None:
        line += f"; this invocation {total_s:.1f}s"
    return line


def serve_verifier(run_dir: str | Path, verifier: str) -> str:
    """The verifier an engine serves (:func:`specdraft.engines.serve.served_verifier`)."""
    from specdraft.engines.serve import served_verifier

    return served_verifier(run_dir, verifier)


def _serve_lines(eval_config: Any, eval_manifest: Manifest | None, out: str,
                 verifier: str, fmt: str, *, run_dir: Any = None,
                 given: str | None = None) -> list[str]:
    """How to serve: the serve plan's best setting when eval ran a --sweep, else the setting
    eval measured (a chain of k, or its SGLang tree); at the dtype the figures were measured at,
    on the local ``verifier`` (:func:`specdraft.engines.serve.serve_block`, with how to make it
    from the ``given`` one when it is not written yet)."""
    from specdraft.engines.serve import engine_python, measured_dtype, serve_block
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
    dtype = measured_dtype(eval_manifest)
    commands = setting.serve_commands(out, verifier, fmt, dtype=dtype, python=engine_python(
        getattr(eval_config, "engine_python", None)))
    if not commands:
        return [head, f"  no engine serves it: a tree needs SGLang, which loads only "
                      f"--format sglang exports (docs/drafters.md)"]
    fixes = ((getattr(eval_manifest, "engine", None) or {}).get("engine_fixes") or [])
    notes = [f"--dtype {dtype}: the dtype the figures above were measured at"]
    if fixes:
        notes.append(f"the engine figure above needed specdraft's fix(es) to the engine, which "
                     f"this plain command does not apply: {'; '.join(f[:80] for f in fixes)}")
    block = serve_block(commands, run_dir=run_dir, verifier=given or verifier, notes=notes)
    return [head] + [f"  {line}" for line in block]
