"""The closing summary of ``specdraft run``: key figures per stage and how to serve the drafter.

Each stage's line is its typed manifest's ``figures()`` (:mod:`specdraft.core.manifest`), the
same line the stage's CLI verb prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdraft.core.manifest import ExportManifest, Manifest

#: HF ids of the verifiers specdraft ships as GGUF (the engines serve the HF checkpoint).
KNOWN_HF_IDS = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def serve_commands(export_dir: str, verifier: str, k: int = 3, topk: int = 1,
                   num_draft_tokens: int | None = None, fmt: str = "sglang") -> list[str]:
    """The command lines to serve the exported drafter: vLLM for a chain of ``k`` drafts
    (``topk`` 1; vLLM 0.32 drafts chains only) and SGLang for a chain or a tree, but only for
    the ``sglang`` export format, the one SGLang loads (docs/drafters.md). Empty when no engine
    serves that combination (a tree of a vllm-format drafter). Flags from the engines' docs,
    see docs/run-dir.md and docs/trees-and-serve-plan.md."""
    commands = []
    if topk == 1:
        spec = json.dumps({"method": "eagle3", "model": export_dir,
                           "num_speculative_tokens": k})
        commands.append(f"vllm serve {verifier} --speculative-config '{spec}'")
    if fmt == "sglang":
        commands.append(
            f"python -m sglang.launch_server --model-path {verifier} "
            f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {export_dir} "
            f"--speculative-num-steps {k} --speculative-eagle-topk {topk} "
            f"--speculative-num-draft-tokens {num_draft_tokens or k + 1}")
    return commands


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
        verifier = KNOWN_HF_IDS.get(config.verifier, config.verifier)
        if verifier.endswith(".gguf"):
            verifier = "<the verifier's HF id or directory>"
        out = str(Path(export.out).resolve())
        lines += _serve_lines(config.stages.get("eval"), manifests.get("eval"), out, verifier,
                              export.format)
    return "\n".join(lines)


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
    return [head] + [f"  {c}" for c in commands]
