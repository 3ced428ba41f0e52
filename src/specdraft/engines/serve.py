"""The command lines that serve an exported drafter in vLLM and SGLang.

Flags from the engines' own documentation (vLLM ``--speculative-config``; SGLang
``--speculative-algorithm EAGLE3`` with its step, top-k and draft-token flags), see
docs/run-dir.md and docs/trees-and-serve-plan.md.
"""

from __future__ import annotations

import json

from specdraft.artifacts.dflash_export import speculative_method

#: HF ids of the verifiers specdraft ships as GGUF (the engines serve the HF checkpoint).
KNOWN_HF_IDS = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def serve_commands(export_dir: str, verifier: str, k: int = 3, topk: int = 1,
                   num_draft_tokens: int | None = None, fmt: str = "sglang") -> list[str]:
    """The command lines to serve the exported drafter: vLLM for a chain of ``k`` drafts
    (``topk`` 1; vLLM 0.32 drafts chains only) and SGLang for a chain or a tree, but only for
    the ``sglang`` export format, the one SGLang loads (docs/drafters.md); the method is the
    export's (:func:`specdraft.artifacts.dflash_export.speculative_method`: a DFlash export is
    served ``"method": "dflash"``, by vLLM only). Empty when no engine serves that combination
    (a tree of a vllm-format drafter). Flags from the engines' docs, see docs/run-dir.md and
    docs/trees-and-serve-plan.md."""
    commands = []
    method = speculative_method(export_dir)
    if topk == 1:
        spec = json.dumps({"method": method, "model": export_dir,
                           "num_speculative_tokens": k})
        commands.append(f"vllm serve {verifier} --speculative-config '{spec}'")
    if fmt == "sglang" and method == "eagle3":
        commands.append(" ".join(sglang_server_args(verifier, export_dir, k=k, topk=topk,
                                                    num_draft_tokens=num_draft_tokens)))
    return commands


def sglang_server_args(verifier: str, drafter: str, *, k: int, topk: int = 1,
                       num_draft_tokens: int | None = None, python: str = "python") -> list[str]:
    """SGLang's server command serving ``drafter`` (an EAGLE-3 export) on ``verifier``:
    ``k`` draft steps, ``topk`` branches per step, ``num_draft_tokens`` verified per step
    (none: ``k + 1``, a chain). Flags of ``python -m sglang.launch_server``
    (``--speculative-algorithm EAGLE3`` and its step, top-k and draft-token flags, SGLang's
    server arguments). The one place they are written: the serve line and ``eval --engine
    sglang`` (which adds dtype, host and port) both use it."""
    return [python, "-m", "sglang.launch_server", "--model-path", str(verifier),
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(drafter),
            "--speculative-num-steps", str(k), "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(num_draft_tokens or k + 1)]
