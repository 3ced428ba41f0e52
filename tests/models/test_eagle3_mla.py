"""The MLA EAGLE-3 drafter (``models/eagle3_mla.py``) against an independent reference: the
verifier family's own attention, transformers' ``DeepseekV3Attention`` (interleaved YaRN rotary
on the rope part, mscale² softmax scale), fed the same 2H-wide input with the same weights.
Kimi-K2's rotary (``tests/kimi_fixture.py``: YaRN factor 32, mscale_all_dim 1) at positions past
the original 4096 window."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from specdraft.core.errors import ConfigError
from specdraft.core.profile import resolve_profile
from specdraft.models.eagle3 import DraftKVCache, ttt_attention_dense
from specdraft.models.eagle3_mla import Eagle3MLAConfig, Eagle3MLADraftModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kimi_fixture import kimi_config  # noqa: E402

T, START = 9, 5000  # positions 5000..5008: beyond the YaRN original window of 4096


def _drafter(seed: int = 0) -> Eagle3MLADraftModel:
    torch.manual_seed(seed)
    cfg = Eagle3MLAConfig.from_profile(resolve_profile(kimi_config(300)), draft_vocab_size=100,
                                       aux_layer_ids=(1, 2, 3))
    model = Eagle3MLADraftModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model


def _reference(model: Eagle3MLADraftModel):
    """transformers' DeepseekV3Attention over 2H inputs with the drafter's weights; its o_proj
    is the drafter's stacked over zeros, so output[..., :H] is the drafter's."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    c = model.config
    dc = c.deepseek_config()
    dc.hidden_size = 2 * c.hidden_size
    dc._attn_implementation = "eager"
    ref = DeepseekV3Attention(dc, layer_idx=0).eval()
    ours = model.midlayer.self_attn
    with torch.no_grad():
        for name in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa",
                     "kv_a_layernorm", "kv_b_proj"):
            getattr(ref, name).weight.copy_(getattr(ours, name).weight)
        ref.o_proj.weight.copy_(torch.cat([ours.o_proj.weight,
                                           torch.zeros_like(ours.o_proj.weight)]))
    return ref


@torch.no_grad()
def _both(model):
    torch.manual_seed(1)
    c = model.config
    x = torch.randn(1, T, 2 * c.hidden_size)
    pos = torch.arange(START, START + T)[None]
    cos_sin = model.rotary(x, pos)
    attn = model.midlayer.self_attn
    q, k, v = attn.qkv(x, cos_sin)
    ours = attn.out(ttt_attention_dense(q, [k], [v], c.head_dim ** -0.5))
    causal = torch.full((T, T), float("-inf")).triu(1)[None, None]
    ref = _reference(model)(x, cos_sin, causal)[0][..., :c.hidden_size]
    return ours, ref


def test_attention_equals_transformers_deepseek_v3():
    model = _drafter()
    c = model.config
    assert (c.head_dim, c.kv_lora_rank, c.qk_rope_head_dim, c.v_head_dim) == (96, 512, 64, 32)
    assert c.mla_scale() == pytest.approx(96 ** -0.5 * (0.1 * torch.log(torch.tensor(32.)).item()
                                                          + 1) ** 2)
    ours, ref = _both(model)
    assert float((ours - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


def test_planted_rotary_and_scale_faults_fail():
    """Neox halves instead of interleaved pairs, and the scale without mscale², both differ."""
    import specdraft.models.eagle3_mla as mla
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb

    model = _drafter()
    _, ref = _both(model)
    model.midlayer.self_attn.q_gain = 1.0
    ours, _ = _both(model)
    assert float((ours - ref).abs().max()) > 1e-2 * float(ref.abs().max())
    model = _drafter()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mla, "apply_rotary_pos_emb_interleave", apply_rotary_pos_emb)
        ours, _ = _both(model)
    assert float((ours - ref).abs().max()) > 1e-2 * float(ref.abs().max())


def test_ttt_paths_agree_and_cache_equals_step_zero():
    """fused == dense over 3 TTT steps (outputs and gradients; values padded to the q/k width),
    and the cached inference path equals TTT step 0."""
    import dataclasses

    outs, grads = {}, {}
    for impl in ("dense", "fused"):
        model = _drafter()
        model.config = dataclasses.replace(model.config, attn_impl=impl)
        torch.manual_seed(2)
        ids = torch.randint(0, 300, (1, T))
        h = model.fuse_aux(torch.randn(1, T, 3 * 64))
        history, total = [], 0
        for step in range(3):
            pos = torch.arange(START, START + T)[None] + step
            h = model.ttt_step(ids, h, pos, history)
            total = total + model.logits(h).logsumexp(-1).sum()
        total.backward()
        outs[impl] = h.detach()
        grads[impl] = model.midlayer.self_attn.kv_b_proj.weight.grad.clone()
    assert torch.allclose(outs["fused"], outs["dense"], atol=1e-5, rtol=1e-4)
    assert torch.allclose(grads["fused"], grads["dense"], atol=1e-5, rtol=1e-4)
    model = _drafter()
    with torch.no_grad():
        ids = torch.randint(0, 300, (1, T))
        h = model.fuse_aux(torch.randn(1, T, 3 * 64))
        pos = torch.arange(START, START + T)[None]
        a = model.ttt_step(ids, h, pos, [])
        b = model.forward_cached(ids, h, pos, DraftKVCache())
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_shape_from_profile_and_refusals():
    from family_configs import tiny_config

    with pytest.raises(ConfigError, match="not an MLA verifier"):
        Eagle3MLAConfig.from_profile(resolve_profile(tiny_config("llama31", 100)),
                                     draft_vocab_size=50, aux_layer_ids=(1, 2, 3))
    cfg = _drafter().config
    assert cfg.num_key_value_heads == cfg.num_attention_heads == 2
    assert Eagle3MLAConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="head_dim"):
        Eagle3MLAConfig.from_dict({**cfg.to_dict(), "head_dim": 64})
