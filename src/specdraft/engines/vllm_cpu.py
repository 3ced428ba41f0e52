"""What vLLM's CPU build needs told, run in the ENGINE's interpreter (imports stdlib and torch
only: both workers import it there, :mod:`specdraft.engines.worker`).

vLLM 0.32's CPU platform picks its AMX MLA backend for every MLA model on a CPU with AMX tiles
(``vllm/platforms/cpu.py`` ``get_attn_backend_cls``), whatever the model's dtype, and that
backend takes bf16 weights only (``v1/attention/backends/mla/amx_mla.py``:
``supported_dtypes = [torch.bfloat16]``; loading a float32 model fails in
``convert_weight_packed`` with "expect weight to be bfloat16, float16, int8, ..."). Its
reference backend, ``CPU_MLA``, runs any dtype and is what a CPU without AMX gets anyway.

:data:`VLLM_REFUSALS` is the one table of the drafter/verifier combinations vLLM 0.32 (its CPU
build or any) cannot serve, read by ``specdraft run``'s config check and by ``eval --engine
vllm`` before anything runs (:func:`vllm_refusals`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def attention_kwargs(dtype: str) -> dict:
    """``vllm.LLM`` keyword arguments for a model of ``dtype`` (``"float32"``, ``"bfloat16"``,
    ``"auto"``, ...): ``{"attention_config": {"backend": "CPU_MLA"}}`` on a CPU-only torch when
    ``dtype`` is not bf16/auto, so an MLA verifier in float32 loads on an AMX CPU (module
    docstring); ``{}`` on CUDA and for bf16. For a model without MLA the CPU platform ignores the
    setting (it logs "Cannot use CPU_MLA backend on CPU" and keeps its one backend, CPU_ATTN)."""
    backend = _backend(dtype)
    return {"attention_config": {"backend": backend}} if backend else {}


def draft_attention_kwargs(dtype: str) -> dict:
    """The same for an EAGLE-3 ``speculative_config`` (``{"attention_backend": "CPU_MLA"}`` or
    ``{}``): vLLM never lets the draft inherit the verifier's backend
    (``v1/spec_decode/llm_base_proposer.py`` ``_create_draft_vllm_config``), so an MLA drafter
    (``Eagle3DeepseekV2ForCausalLM``) needs it told again."""
    backend = _backend(dtype)
    return {"attention_backend": backend} if backend else {}


def _backend(dtype: str) -> str | None:
    import torch

    if torch.cuda.is_available() or dtype in ("bfloat16", "auto"):
        return None
    return "CPU_MLA"


# ------------------------------------------------------------ what vLLM 0.32 cannot serve
# One table of the engine/drafter/verifier combinations vLLM 0.32 refuses (facts read from its
# source and tried on its CPU build: ../shared/reference/vllm-0.32-cpu-facts.md), checked when
# `specdraft run` reads its config (pipeline/config.py) and when `specdraft eval --engine vllm`
# starts (eval/run.py), before any stage or decode runs: :func:`vllm_refusals`.

#: The MLA latent width vLLM 0.32's CPU MLA backend decodes (``kv_lora_rank`` 512 +
#: ``qk_rope_head_dim`` 64; ``v1/attention/backends/mla/cpu_mla.py``).
CPU_MLA_LATENT = 576
#: Verifier ``model_type``s whose vLLM 0.32 model has no ``SupportsEagle3`` (no aux hidden-state
#: capture: ``gemma3.py``, ``phi3.py``).
NO_AUX_CAPTURE = ("gemma3", "gemma3_text", "phi3")


@dataclass(frozen=True)
class Combination:
    """What decides whether vLLM can serve a run: the drafter ``kind`` (``eagle3``/``dflash``)
    and its ``layer`` (EAGLE-3's ``llama``/``qwen3``/``mla``; None for DFlash), the verifier's
    ``model_type`` and MLA latent width (``kv_lora_rank + qk_rope_head_dim``, None without
    MLA), and whether vLLM runs its CPU build (``cpu``)."""

    kind: str
    layer: str | None
    verifier_type: str
    latent: int | None
    cpu: bool


@dataclass(frozen=True)
class Refusal:
    """One row: ``applies`` to a :class:`Combination`; ``what`` names it, ``engine_says`` is the
    engine's own error and its file, ``instead`` the alternative to offer."""

    applies: Callable[[Combination], bool]
    what: Callable[[Combination], str]
    engine_says: str
    instead: str


VLLM_REFUSALS: tuple[Refusal, ...] = (
    Refusal(lambda c: c.cpu and c.kind == "eagle3" and c.layer in ("llama", "qwen3")
            and c.latent is not None,
            lambda c: f"a {c.layer}-layer EAGLE-3 drafter on an MLA verifier ({c.verifier_type}) "
                      f"in vLLM's CPU build",
            "'No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])' at "
            "start-up (v1/worker/utils.py: the verifier's MLA cache needs blocks of 16, the "
            "drafter's attention multiples of 32)",
            "train --drafter-layer mla (vLLM's MLA drafter, Eagle3DeepseekV2ForCausalLM), or "
            "evaluate on a CUDA build of vLLM"),
    Refusal(lambda c: c.cpu and c.latent is not None and c.latent != CPU_MLA_LATENT,
            lambda c: f"an MLA verifier ({c.verifier_type}) of latent width {c.latent} "
                      f"(kv_lora_rank + qk_rope_head_dim) in vLLM's CPU build",
            f"its CPU MLA backend decodes latent width {CPU_MLA_LATENT} only "
            f"(v1/attention/backends/mla/cpu_mla.py)",
            "--engine none (offline figures only) on this machine, or a CUDA build of vLLM"),
    Refusal(lambda c: c.kind == "eagle3" and c.verifier_type in NO_AUX_CAPTURE,
            lambda c: f"an EAGLE-3 drafter on a {c.verifier_type} verifier in vLLM 0.32",
            "its model has no SupportsEagle3, so no aux hidden states reach the drafter "
            "(model_executor/models/gemma3.py, phi3.py)",
            "--engine none (offline figures only)"),
)


def vllm_refusals(combo: Combination) -> list[str]:
    """One line per :data:`VLLM_REFUSALS` row that applies to ``combo``: the combination, what
    vLLM does with it, and the alternative."""
    return [f"vLLM cannot serve {r.what(combo)}: {r.engine_says}; instead: {r.instead}"
            for r in VLLM_REFUSALS if r.applies(combo)]


def combination(kind: str, layer: str | None, profile: object) -> Combination:
    """The :class:`Combination` of a drafter ``kind``/``layer`` and a verifier profile
    (:class:`specdraft.core.profile.VerifierProfile`: its ``model_type`` and ``mla``), with
    ``cpu`` = this machine has no CUDA device (vLLM's CPU build is the one installed here, as
    :func:`attention_kwargs` decides)."""
    import torch

    mla = getattr(profile, "mla", None)
    latent = None if mla is None else mla.kv_lora_rank + mla.qk_rope_head_dim
    return Combination(kind, layer, str(getattr(profile, "model_type", "")), latent,
                       not torch.cuda.is_available())


def tensor_parallel_refusal(size: int, *, cpu: bool) -> str | None:
    """Why vLLM cannot run with ``tensor_parallel_size`` ``size`` here, or None: specdraft
    runs vLLM's CPU build in one worker process (``enforce_eager``, the ``uni`` executor: one
    device), so a size above 1 is refused there; on CUDA the engine shards over ``size`` GPUs
    (the ``mp`` executor)."""
    if size > 1 and cpu:
        return (f"--engine-tensor-parallel-size {size}: vLLM's CPU build runs here in one worker "
                f"process (one device); tensor parallelism needs a CUDA build of vLLM with "
                f"{size} GPUs: use 1 on this machine")
    return None
