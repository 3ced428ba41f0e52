"""The closing summary of ``specdraft run``: key figures per stage and how to serve the drafter.

Each stage's line is built from its manifest by one small function in :data:`FIGURES`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def _rejects(by_reason: dict[str, int] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (by_reason or {}).items()) or "none"


def _rates(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


def _generate(m: dict[str, Any]) -> str:
    s = m.get("summary", {})
    return (f"{s.get('generated', 0)} samples, rejected: {_rejects(s.get('rejected'))}, "
            f"errors {s.get('errors', 0)}, with reasoning {s.get('with_reasoning', 0)}, "
            f"{s.get('completion_tokens', 0)} completion tokens "
            f"(mean {s.get('completion_tokens_mean', 0):.0f})")


def _prepare(m: dict[str, Any]) -> str:
    s = m.get("summary", {})
    return (f"{s.get('tokenized', 0)} rows, rejected: {_rejects(s.get('rejected_by_reason'))}, "
            f"{s.get('total_tokens', 0)} tokens, {s.get('supervised_tokens', 0)} supervised, "
            f"{s.get('truncated', 0)} truncated")


def _vocab(m: dict[str, Any]) -> str:
    v = m.get("vocab", {})
    return (f"K = {v.get('draft_vocab_size')} of V = {v.get('verifier_vocab_size')}, "
            f"coverage {100 * v.get('coverage', 0):.2f}% of supervised tokens")


def _extract(m: dict[str, Any]) -> str:
    c, s = m.get("counts", {}), m.get("storage", {})
    return (f"{c.get('rows_out', 0)} rows, {c.get('tokens', 0)} tokens, "
            f"{s.get('bytes_total', 0) / 2**20:.1f} MiB {s.get('format')} "
            f"({s.get('bytes_per_token', 0):.0f} B/token), aux ids {m.get('aux_layer_ids')}")


def _train(m: dict[str, Any]) -> str:
    best = m.get("best_val") or {}
    return (f"{m.get('steps', 0)} steps, best validation tau-hat {best.get('tau', 0):.3f} "
            f"(step {m.get('best_step')}), conditional acc per step "
            f"{_rates(best.get('cond_acc', []))}, "
            f"{m.get('tokens_per_s', 0):.0f} tokens/s")


def _export(m: dict[str, Any]) -> str:
    return f"{m.get('format')} -> {m.get('out')}, aux ids for engines {m.get('engine_aux_ids')}"


def _eval(m: dict[str, Any]) -> str:
    line = (f"offline tau {m.get('tau', 0):.3f}, acceptance rate "
            f"{m.get('acceptance_rate', 0):.3f}, per-position "
            f"{_rates(m.get('per_position', []))}, {m.get('verify_steps', 0)} verify steps, "
            f"{m.get('tokens_per_s', 0):.1f} tokens/s")
    e = m.get("engine")
    if not e:
        return line
    line += (f"\n{'':20}engine {e.get('version')}: tau {e.get('tau') or 0:.3f}, acceptance rate "
             f"{e.get('acceptance_rate') or 0:.3f}, per-position "
             f"{_rates(e.get('per_position') or [])}")
    if e.get("tau_offline_minus_engine") is not None:
        line += (f", offline - engine {e['tau_offline_minus_engine']:+.3f}, identical prompts "
                 f"{e.get('identical_prompts')}")
    return line


FIGURES: dict[str, Callable[[dict[str, Any]], str]] = {
    "generate": _generate, "prepare": _prepare, "vocab": _vocab, "extract": _extract,
    "train": _train, "export": _export, "eval": _eval,
}


#: HF ids of the verifiers specdraft ships as GGUF (the engines serve the HF checkpoint).
KNOWN_HF_IDS = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def serve_commands(export_dir: str, verifier: str, k: int = 3) -> list[str]:
    """The command lines to serve the exported drafter with vLLM and SGLang (chain drafting of
    ``k`` tokens; flags from the engines' docs, see docs/run-dir.md)."""
    spec = json.dumps({"method": "eagle3", "model": export_dir, "num_speculative_tokens": k})
    return [
        f"vllm serve {verifier} --speculative-config '{spec}'",
        f"python -m sglang.launch_server --model-path {verifier} "
        f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {export_dir} "
        f"--speculative-num-steps {k} --speculative-eagle-topk 1 "
        f"--speculative-num-draft-tokens {k + 1}",
    ]


def format_summary(config: Any, manifests: dict[str, dict[str, Any] | None]) -> str:
    """A plain-text block: one line per stage (elapsed seconds and key figures), then serving."""
    lines = [f"specdraft run summary ({config.run_dir})"]
    for name, manifest in manifests.items():
        if manifest is None:
            lines.append(f"  {name:<9} not run")
            continue
        lines.append(f"  {name:<9} {manifest.get('elapsed_s', 0):>7.1f}s  "
                     f"{FIGURES[name](manifest)}")
    export = manifests.get("export")
    if export is not None:
        verifier = KNOWN_HF_IDS.get(config.verifier, config.verifier)
        if verifier.endswith(".gguf"):
            verifier = "<the verifier's HF id or directory>"
        k = getattr(config.stages.get("eval"), "k", 3)
        lines.append(f"Serve the drafter ({k} draft tokens per step, as evaluated):")
        out = str(Path(export.get("out", "")).resolve())
        lines += [f"  {c}" for c in serve_commands(out, verifier, k)]
    return "\n".join(lines)
