"""vLLM 0.32 builds the drafter's rotary from the exported config.json exactly as specdraft
trained it: its transformers parses the config, its ``get_rope`` builds the rotary the Llama
EAGLE-3 layer uses (``model_executor/models/llama.py`` ``LlamaAttention._init_rotary_emb``), and
the rotated q/k equal the drafter's for llama3 + partial, gpt-oss YaRN, DeepSeek YaRN
(mscale / mscale_all_dim) and partial default rotary, to float32's angle noise (``tolerance``).
A config that lost the partial factor, and one whose llama3 factor is 1 % off, are caught
(planted). One vLLM subprocess, no engine start (~30-110 s: vLLM's import)."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
import torch

from specdraft.artifacts.formats import build_config
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel, apply_rotary

HERE = Path(__file__).parent
CASES = {
    "llama3_partial": dict(rope_theta=5e5, partial_rotary_factor=0.5, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}),
    "yarn_gpt_oss": dict(rope_theta=150000.0, rope_scaling={
        "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 64}),
    "yarn_deepseek": dict(rope_theta=10000.0, rope_scaling={
        "rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 64}),
    "default_partial": dict(rope_theta=1e4, partial_rotary_factor=0.25),
}


def tolerance(pos: torch.Tensor, q: torch.Tensor) -> float:
    """The largest |q/k difference| two correct float32 rotaries may show: vLLM takes cos/sin from
    a cached table, transformers computes them per call, and the CPU picks the kernels. Angles reach
    ``max(pos)`` rad, whose float32 spacing is about ``max(pos) * 2^-23``; four such steps, times
    the largest |q|, bound the difference (6.1e-5 rad near 994: 2.1e-3 here). Identical on this
    machine (0.0), 6.5e-4 on a CI host (2026-12-06). A 1 % wrong factor or theta moves q by >= 0.03
    (measured), so the bound still separates right from wrong."""
    return 4 * torch.finfo(torch.float32).eps * pos.max().item() * q.abs().max().item()


def case(kw: dict, pos: torch.Tensor) -> dict:
    c = Eagle3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     intermediate_size=128, rms_norm_eps=1e-5, max_position_embeddings=1024,
                     vocab_size=100, draft_vocab_size=20, target_hidden_size=64,
                     aux_layer_ids=(1, 2, 3), **kw)
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, len(pos), 16), torch.randn(1, 2, len(pos), 16)
    rq, rk = apply_rotary(q, k, *Eagle3DraftModel(c).rotary(q, pos.unsqueeze(0)))
    return {"cfg": build_config("sglang", c), "q": q, "k": k, "pos": pos, "rq": rq, "rk": rk}


@pytest.mark.slow
def test_vllm_rotary_equals_the_drafters(tmp_path):
    from stubs import vllm_python_or_skip

    python = vllm_python_or_skip()
    pos = torch.arange(0, 1000, 7)  # past every original_max_position_embeddings (64)
    cases = {name: case(kw, pos) for name, kw in CASES.items()}
    planted = copy.deepcopy(cases["default_partial"])
    planted["cfg"]["rope_parameters"].pop("partial_rotary_factor")  # the speculators #613 bug
    planted["cfg"].pop("partial_rotary_factor")
    cases["planted_no_partial"] = planted
    off = copy.deepcopy(cases["llama3_partial"])  # trained at factor 8, served at 8.08
    for key in ("rope_scaling", "rope_parameters"):
        off["cfg"][key]["factor"] = 8.08
    cases["planted_factor_1pct"] = off
    torch.save(cases, tmp_path / "in.pt")
    subprocess.run([python, str(HERE / "rotary_worker.py"), str(tmp_path / "in.pt"),
                    str(tmp_path / "out.json")], check=True, timeout=600)
    got = json.loads((tmp_path / "out.json").read_text())
    assert {n: got[n]["rotary_dim"] for n in got} == {
        "llama3_partial": 8, "yarn_gpt_oss": 16, "yarn_deepseek": 16, "default_partial": 4,
        "planted_no_partial": 16, "planted_factor_1pct": 8}
    tol = max(tolerance(pos, c["q"]) for c in cases.values())
    assert 1e-3 < tol < 3e-3  # 4 * 2^-23 * 994 * max|q| (4.34)
    for name in CASES:
        assert got[name]["max_dq"] <= tol and got[name]["max_dk"] <= tol, (name, got[name])
        assert got[name]["moved"] > 1e-1, name  # the rotary did rotate
    assert got["planted_no_partial"]["max_dq"] > 10 * tol
    assert max(got["planted_factor_1pct"]["max_dq"], got["planted_factor_1pct"]["max_dk"]) > 10 * tol
