"""The command lines that serve an exported drafter in vLLM and SGLang.

Flags from the engines' own documentation (vLLM ``--speculative-config``; SGLang
``--speculative-algorithm EAGLE3`` with its step, top-k and draft-token flags), see
docs/run-dir.md and docs/trees-and-serve-plan.md.
"""

from __future__ import annotations

import json
from pathlib import Path

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


def served_verifier(run_dir: str | Path | None, verifier: str) -> str:
    """The verifier an engine serves: ``RUN/verifier-hf`` when a stage wrote it (a GGUF converted
    once to the HF directory the engine served in extract or eval, ``engines.verifier_dir``:
    local, nothing to download), else the HF id of a shipped GGUF (:data:`KNOWN_HF_IDS`), else
    ``verifier`` as given (a GGUF elsewhere: a placeholder, engines serve HF checkpoints)."""
    from specdraft.engines.verifier_dir import ENGINE_HF_DIR

    if run_dir is not None:
        converted = Path(run_dir) / ENGINE_HF_DIR
        if (converted / "config.json").is_file():
            return str(converted.resolve())
    verifier = KNOWN_HF_IDS.get(verifier, verifier)
    return "<the verifier's HF id or directory>" if verifier.endswith(".gguf") else verifier


def hub_id(verifier: str) -> str | None:
    """The verifier's Hugging Face id when one is known: a shipped GGUF's
    (:data:`KNOWN_HF_IDS`), or ``verifier`` itself when it is spelled ``org/name`` and is no
    local path; None otherwise (a model card then names no ``base_model``)."""
    if verifier in KNOWN_HF_IDS:
        return KNOWN_HF_IDS[verifier]
    parts = verifier.split("/")
    if len(parts) == 2 and all(parts) and not Path(verifier).exists() and \
            not verifier.startswith((".", "~")):
        return verifier
    return None


def write_export_card(run_dir: str | Path | None, export_dir: str | Path, *, kind: str,
                      fmt: str, verifier: str, k: int) -> Path:
    """Write the export's model card (:mod:`specdraft.artifacts.model_card`) from the run's
    manifests, with the serve lines of a chain of ``k`` drafts on the served verifier. Called by
    ``export`` when it writes the directory and by ``eval`` once it has measured."""
    from specdraft.artifacts.model_card import card_facts, write_model_card

    served = served_verifier(run_dir, verifier)
    facts = card_facts(run_dir, kind=kind, fmt=fmt, verifier=verifier,
                       base_model=hub_id(verifier),
                       serve=serve_commands(str(Path(export_dir).resolve()), served, k=k,
                                            fmt=fmt))
    return write_model_card(export_dir, facts)
