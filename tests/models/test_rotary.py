"""The drafter's rotary equals the verifier's own, with transformers' model code as the oracle.

For each family the drafter is built from the verifier's config (``Eagle3Config.from_verifier``:
profile -> drafter), and its rotary (``Eagle3DraftModel.rotary`` + the attention's ``qkv``) is
compared with the verifier class's own ``RotaryEmbedding`` and ``apply_rotary_pos_emb`` at
positions past the original context (where the scaling changes the angles). Each test also
plants the bug it guards against (scaling dropped, partial factor ignored) and sees it caught.
"""

from __future__ import annotations

import pytest
import torch

from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel

TOL = dict(atol=1e-6, rtol=1e-6)
POS = torch.arange(0, 700, 7).unsqueeze(0)  # [1, 100]: up to 693, past original_max (64)


def llama3_config():
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       vocab_size=100, max_position_embeddings=1024,
                       rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                        "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64})


def gpt_oss_config():
    from transformers import GptOssConfig

    return GptOssConfig(hidden_size=64, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        num_local_experts=4, num_experts_per_tok=2, vocab_size=100,
                        max_position_embeddings=2048,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                         "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                         "truncate": False,
                                         "original_max_position_embeddings": 64})


def qwen3_next_config():
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, num_experts=4, num_experts_per_tok=2, vocab_size=100,
                           max_position_embeddings=1024,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.25})


def drafter(hf, **overrides) -> Eagle3DraftModel:
    torch.manual_seed(0)
    c = Eagle3Config.from_verifier(hf, draft_vocab_size=20, aux_layer_ids=(1, 2, 3), **overrides)
    return Eagle3DraftModel(c).eval()


def drafter_qk(m: Eagle3DraftModel, x: torch.Tensor):
    """The drafter's own rotated q, k (its attention code path), and q, k before rotary."""
    attn = m.midlayer.self_attn
    B, T, _ = x.shape
    c = m.config
    q = attn.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
    rq, rk, _ = attn.qkv(x, m.rotary(x, POS))
    return (rq, rk), (q, k)


def assert_rotates_like(m: Eagle3DraftModel, x: torch.Tensor, cos, sin, oracle_apply):
    """The drafter's rotated q/k equal ``oracle_apply(q, k, cos, sin)``; returns (q, rotated q)."""
    (rq, rk), (q, k) = drafter_qk(m, x)
    want_q, want_k = oracle_apply(q, k, cos, sin)
    torch.testing.assert_close(rq, want_q, **TOL)
    torch.testing.assert_close(rk, want_k, **TOL)
    return q, rq


def x_for(m: Eagle3DraftModel) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(1, POS.shape[1], 2 * m.config.hidden_size)


def test_llama3_scaling_matches_llama_rotary():
    from transformers.models.llama.modeling_llama import (LlamaRotaryEmbedding,
                                                          apply_rotary_pos_emb)

    hf = llama3_config()
    m = drafter(hf)
    assert m.config.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 64}
    x = x_for(m)
    cos, sin = LlamaRotaryEmbedding(hf)(x, POS)
    ours = m.rotary(x, POS)
    torch.testing.assert_close(ours[0], cos, **TOL)
    torch.testing.assert_close(ours[1], sin, **TOL)
    assert_rotates_like(m, x, cos, sin, apply_rotary_pos_emb)
    # planted: the llama3 scaling dropped (speculators PR#574) -> other angles past 64
    plain = drafter(hf, rope_scaling=None)
    assert (plain.rotary(x, POS)[0] - cos).abs().max() > 1e-2


def test_yarn_with_attention_factor_matches_gpt_oss_rotary():
    from transformers.models.gpt_oss.modeling_gpt_oss import (GptOssRotaryEmbedding,
                                                              apply_rotary_pos_emb)

    hf = gpt_oss_config()
    m = drafter(hf)
    x = x_for(m)
    oracle = GptOssRotaryEmbedding(hf)
    assert oracle.attention_scaling == pytest.approx(0.1 * torch.log(torch.tensor(32.0)).item()
                                                     + 1)  # YaRN's mscale, 1.3466
    cos, sin = oracle(x, POS)  # [1, T, d/2]: gpt-oss rotates halves without duplicating
    ours = m.rotary(x, POS)
    half = m.config.head_dim // 2
    for a, b in ((ours[0], cos), (ours[1], sin)):
        torch.testing.assert_close(a[..., :half], b, **TOL)
        torch.testing.assert_close(a[..., half:], b, **TOL)
    assert_rotates_like(m, x, cos, sin, apply_rotary_pos_emb)
    # planted: YaRN's attention factor lost (truncate and mscale kept, rope_type mistaken)
    linear = drafter(hf, rope_scaling={"rope_type": "linear", "factor": 32.0})
    assert (linear.rotary(x, POS)[0][..., :half] - cos).abs().max() > 1e-2


def test_partial_rotary_matches_qwen3_next():
    from transformers.models.qwen3_next.modeling_qwen3_next import (Qwen3NextRotaryEmbedding,
                                                                    apply_rotary_pos_emb)

    hf = qwen3_next_config()
    m = drafter(hf)
    assert (m.config.partial_rotary_factor, m.config.rotary_dim) == (0.25, 4)
    x = x_for(m)
    cos, sin = Qwen3NextRotaryEmbedding(hf)(x, POS)  # [1, T, 4]
    ours = m.rotary(x, POS)
    torch.testing.assert_close(ours[0], cos, **TOL)
    torch.testing.assert_close(ours[1], sin, **TOL)
    q, rq = assert_rotates_like(m, x, cos, sin, apply_rotary_pos_emb)
    torch.testing.assert_close(rq[..., 4:], q[..., 4:], atol=0, rtol=0)  # the rest untouched
    # planted: the partial factor ignored (speculators #613): every dimension rotated
    full = drafter(hf, partial_rotary_factor=1.0)
    (fq, _), _ = drafter_qk(full, x)
    assert (fq[..., 4:] - q[..., 4:]).abs().max() > 1e-2


def test_cached_inference_uses_the_same_partial_rotary():
    """TTT and cached inference agree under partial rotary + yarn (one code path for both)."""
    from specdraft.models.eagle3 import DraftKVCache

    hf = qwen3_next_config()
    hf.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                          "original_max_position_embeddings": 256, "partial_rotary_factor": 0.5}
    m = drafter(hf)
    assert m.config.rotary_dim == 8 and m.config.rope_type == "yarn"
    ids = torch.randint(0, 100, (1, 6))
    h = m.fuse_aux(torch.randn(1, 6, 3 * 64))
    pos = torch.arange(6).unsqueeze(0) + 500
    with torch.no_grad():
        p0 = m.ttt_step(ids, h, pos, [])
        c0 = m.forward_cached(ids, h, pos, DraftKVCache())
    torch.testing.assert_close(c0, p0, atol=1e-5, rtol=1e-5)


def test_legacy_rope_scaling_type_key_is_read_as_rope_type():
    """An older config.json spells the scaling type ``type``; it must not fall back to default."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    c = Eagle3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     intermediate_size=128, rms_norm_eps=1e-5, rope_theta=1e4,
                     max_position_embeddings=1024, vocab_size=100, draft_vocab_size=20,
                     target_hidden_size=64, aux_layer_ids=(1, 2, 3),
                     rope_scaling={"type": "linear", "factor": 4.0})
    assert c.rope_type == "linear" and c.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    hf = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                     max_position_embeddings=1024,
                     rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0})
    x = torch.zeros(1, POS.shape[1], 64)
    torch.testing.assert_close(Eagle3DraftModel(c).rotary(x, POS)[0],
                               LlamaRotaryEmbedding(hf)(x, POS)[0], **TOL)
