"""What vLLM's CPU build needs told, run in the ENGINE's interpreter (imports stdlib and torch
only: both workers import it there, :mod:`specdraft.engines.worker`).

vLLM 0.32's CPU platform picks its AMX MLA backend for every MLA model on a CPU with AMX tiles
(``vllm/platforms/cpu.py`` ``get_attn_backend_cls``), whatever the model's dtype, and that
backend takes bf16 weights only (``v1/attention/backends/mla/amx_mla.py``:
``supported_dtypes = [torch.bfloat16]``; loading a float32 model fails in
``convert_weight_packed`` with "expect weight to be bfloat16, float16, int8, ..."). Its
reference backend, ``CPU_MLA``, runs any dtype and is what a CPU without AMX gets anyway.
"""

from __future__ import annotations


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
