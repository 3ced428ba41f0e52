"""Helpers of the vLLM-backend tests: the engine's interpreter, a vLLM-loadable tiny verifier,
and the per-row, per-layer comparison of two extract directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from stubs import vllm_python_or_skip

REPO = Path(__file__).resolve().parents[2]


def vllm_python() -> str:
    """The python with vLLM (:func:`stubs.vllm_python_or_skip`)."""
    return vllm_python_or_skip()


def engine_env() -> dict[str, str]:
    """Environment of a vLLM run on the shared CPUs: 1 GiB KV cache, hub offline."""
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "2", "SPECDRAFT_VLLM_PYTHON": vllm_python()}


def make_vllm_tiny(out: Path, tokenizer_dir: Path) -> Path:
    """A 4-layer random Llama that vLLM's CPU attention accepts (head_dim 64) with a random,
    non-unit final norm weight (so a missing or doubled norm changes every value)."""
    from safetensors.torch import load_file, save_file

    import importlib.util

    spec = importlib.util.spec_from_file_location("top_conftest", REPO / "tests" / "conftest.py")
    top = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(top)
    top.make_tiny_verifier(out, tokenizer_dir, hidden=128, heads=2, kv_heads=1)
    path = out / "model.safetensors"
    tensors = load_file(str(path))
    g = torch.Generator().manual_seed(1)
    tensors["model.norm.weight"] = 0.5 + torch.rand(128, generator=g)  # [H] in [0.5, 1.5)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return out


def max_ratio(a: torch.Tensor, b: torch.Tensor, rel: float, floor: float) -> float:
    """``max |a - b| / (rel·|b| + floor·max|b|)``: <= 1 means within tolerance."""
    if b.numel() == 0:
        return 0.0
    bound = rel * b.abs() + floor * b.abs().max().clamp_min(1e-30)
    return float(((a - b).abs() / bound).max())


def compare_sources(a, b, aux_ids, hidden, *, rel, floor, shift=0):
    """Worst error/bound ratio per (row key, layer id) and per row for final states.

    ``shift`` compares ``a``'s layer ``j + shift`` with ``b``'s layer ``j`` (a planted fault).
    Returns ``{(key, "aux", id): ratio, (key, "final"): ratio}``.
    """
    out = {}
    G = len(aux_ids)
    for x, y in zip(a.get_batch(range(len(a))), b.get_batch(range(len(b)))):
        assert x.key == y.key and torch.equal(x.input_ids, y.input_ids)
        xa, ya = x.aux_hidden.reshape(-1, G, hidden), y.aux_hidden.reshape(-1, G, hidden)
        for j, layer in enumerate(aux_ids):
            k = min(max(j + shift, 0), G - 1)
            out[(x.key, "aux", layer)] = max_ratio(xa[:, k], ya[:, j], rel, floor)
        out[(x.key, "final")] = max_ratio(x.final_hidden, y.final_hidden, rel, floor)
    return out
