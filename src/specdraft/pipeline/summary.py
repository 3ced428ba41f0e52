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


def serve_commands(export_dir: str, verifier: str, k: int = 3, fmt: str = "sglang"
                   ) -> list[str]:
    """The command lines to serve the exported drafter with vLLM and, for the ``sglang``
    format (the only one SGLang loads; docs/drafters.md), SGLang (chain drafting of ``k``
    tokens; flags from the engines' docs, see docs/run-dir.md)."""
    spec = json.dumps({"method": "eagle3", "model": export_dir, "num_speculative_tokens": k})
    vllm = f"vllm serve {verifier} --speculative-config '{spec}'"
    if fmt != "sglang":
        return [vllm]
    return [
        vllm,
        f"python -m sglang.launch_server --model-path {verifier} "
        f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {export_dir} "
        f"--speculative-num-steps {k} --speculative-eagle-topk 1 "
        f"--speculative-num-draft-tokens {k + 1}",
    ]


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
        k = getattr(config.stages.get("eval"), "k", 3)
        lines.append(f"Serve the drafter ({k} draft tokens per step, as evaluated):")
        out = str(Path(export.out).resolve())
        lines += [f"  {c}" for c in serve_commands(out, verifier, k, export.format)]
    return "\n".join(lines)
