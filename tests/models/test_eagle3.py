"""The draft model: names/shapes, TTT attention paths, and TTT == inference with a KV cache."""

import pytest
import torch

from specdraft.models.eagle3 import (DraftKVCache, Eagle3Config, Eagle3DraftModel,
                                     ttt_attention_dense, ttt_attention_fused,
                                     ttt_attention_split)


def tiny_config(**kw) -> Eagle3Config:
    values = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  intermediate_size=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                  max_position_embeddings=4096, vocab_size=50, draft_vocab_size=20,
                  target_hidden_size=16, aux_layer_ids=(1, 2, 3))
    values.update(kw)
    return Eagle3Config(**values)


def test_parameter_names_and_shapes():
    m = Eagle3DraftModel(tiny_config())
    shapes = {k: tuple(v.shape) for k, v in m.checkpoint_state(include_embed=True).items()}
    assert shapes == {
        "embed_tokens.weight": (50, 32), "fc.weight": (32, 48),
        "midlayer.input_layernorm.weight": (32,), "midlayer.hidden_norm.weight": (32,),
        "midlayer.self_attn.q_proj.weight": (32, 64), "midlayer.self_attn.k_proj.weight": (16, 64),
        "midlayer.self_attn.v_proj.weight": (16, 64), "midlayer.self_attn.o_proj.weight": (32, 32),
        "midlayer.post_attention_layernorm.weight": (32,),
        "midlayer.mlp.gate_proj.weight": (64, 32), "midlayer.mlp.up_proj.weight": (64, 32),
        "midlayer.mlp.down_proj.weight": (32, 64), "norm.weight": (32,),
        "lm_head.weight": (20, 32), "d2t": (20,), "t2d": (50,)}
    assert not m.embed_tokens.weight.requires_grad
    assert "embed_tokens.weight" not in m.checkpoint_state()


def test_dense_and_split_ttt_attention_agree():
    torch.manual_seed(0)
    q = torch.randn(2, 3, 5, 4)
    keys = [torch.randn(2, 3, 5, 4) for _ in range(3)]
    values = [torch.randn(2, 3, 5, 4) for _ in range(3)]
    a = ttt_attention_dense(q, keys, values, 0.5)
    b = ttt_attention_split(q, keys, values, 0.5)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T", [1, 7, 64])
@pytest.mark.parametrize("steps", [1, 2, 3])
def test_fused_ttt_attention_equals_dense_values_and_gradients(T, steps):
    """float64, so any difference beyond rounding is a wrong formula (the fused kernel's
    log-sum-exp gradient is ours: a wrong padding value shows up as a gradient difference)."""
    torch.manual_seed(T * 10 + steps)
    xs = [torch.randn(2, 3, T, 8, dtype=torch.float64, requires_grad=True) for _ in range(7)]
    q, keys, values = xs[0], xs[1:1 + steps], xs[4:4 + steps]
    a = ttt_attention_dense(q, keys, values, 0.3)
    b = ttt_attention_fused(q, keys, values, 0.3)
    torch.testing.assert_close(b, a, atol=1e-12, rtol=1e-12)
    g = torch.randn_like(a)
    inputs = [q, *keys, *values]
    for ga, gb in zip(torch.autograd.grad((a * g).sum(), inputs),
                      torch.autograd.grad((b * g).sum(), inputs)):
        torch.testing.assert_close(gb, ga, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("pad", [1, 8])
def test_lse_gradient_with_padded_columns_equals_dense(pad):
    """The CUDA kernel's widening appends 8 columns (alignment), the CPU one 1: the same trick
    (first column -1 / dlse, the rest zero) run through the CPU kernel with either width equals
    the dense reference in float64, values and gradients."""
    from specdraft.models.eagle3 import LSE_KERNELS, LSEKernel, _merge_lse

    cpu = LSE_KERNELS["cpu"]
    kernel = LSEKernel(cpu.forward, cpu.backward, pad=pad)
    torch.manual_seed(pad)
    xs = [torch.randn(1, 2, 33, 16, dtype=torch.float64, requires_grad=True) for _ in range(5)]
    q, keys, values = xs[0], xs[1:3], xs[3:5]
    a = ttt_attention_dense(q, keys, values, 0.25)
    b = _merge_lse(q, keys, values, 0.25, kernel)
    g = torch.randn_like(a)
    for ga, gb in zip(torch.autograd.grad((a * g).sum(), xs), torch.autograd.grad((b * g).sum(), xs)):
        torch.testing.assert_close(gb, ga, atol=1e-12, rtol=1e-12)


def test_cuda_kernel_calls_match_the_ops_schemas_on_meta():
    """The CUDA kernel's forward and backward calls, run on the ``meta`` device (no GPU here):
    argument order and types accepted by the ops, the log-sum-exp cut from its padded
    [B, h, ceil(T/32)*32] to [B, h, T], the gradients shaped like q, k, v."""
    from specdraft.models.eagle3 import LSE_KERNELS, _merge_lse

    xs = [torch.empty(2, 4, 100, 64, device="meta", requires_grad=True) for _ in range(5)]
    out, lse, saved = LSE_KERNELS["cuda"].forward(xs[0], xs[1], xs[2], 0.125)
    assert lse.shape == (2, 4, 100) and saved[0].shape == (2, 4, 128)
    out = _merge_lse(xs[0], xs[1:3], xs[3:5], 0.125, LSE_KERNELS["cuda"])
    grads = torch.autograd.grad(out.sum(), xs)
    assert [tuple(g.shape) for g in grads] == [(2, 4, 100, 64)] * 5


def test_fused_kernel_check_catches_a_wrong_kernel():
    """``check_fused_kernel`` (run once per CUDA device before ``fused`` uses its kernel): the
    CPU kernel passes; planted faults — a log-sum-exp off by 0.01, a backward that ignores the
    widening's -1 column — are named; a device with no kernel falls back to split, warned."""
    from specdraft.models.eagle3 import LSE_KERNELS, LSEKernel, check_fused_kernel, fused_kernel

    cpu, dev = LSE_KERNELS["cpu"], torch.device("cpu")
    assert check_fused_kernel(cpu, dev) is None

    def shifted_forward(q, k, v, scale):
        out, lse, saved = cpu.forward(q, k, v, scale)
        return out, lse + 0.01, saved

    def lse_blind_backward(d_out, q, k, v, out, saved, scale):
        return cpu.backward(d_out, q, k, v, out.clone().index_fill_(-1, torch.tensor(
            [out.shape[-1] - 1]), 0.0), saved, scale)

    assert check_fused_kernel(LSEKernel(shifted_forward, cpu.backward, 1), dev).startswith("out ")
    reason = check_fused_kernel(LSEKernel(cpu.forward, lse_blind_backward, 1), dev)
    assert reason is not None and reason.startswith("d"), reason
    with pytest.warns(UserWarning, match="no kernel on meta"):
        assert fused_kernel(torch.device("meta")) is None


@pytest.mark.parametrize("mode", ["autocast", "no_grad"])
def test_fused_kernel_check_ignores_the_callers_mode(mode):
    """The check's first call comes from inside a training step's bf16 autocast or a no-grad
    validation; under either it used to fail (split's matmuls in bf16 against the kernel's fp32:
    3.5e-3 > 1e-4; no gradient at all), so every default CUDA run fell back to split. It runs in
    the dtype it is asked for, autocast off, gradients on; bf16 inputs at head dim 128 pass at
    bf16's tolerance."""
    from specdraft.models.eagle3 import LSE_KERNELS, check_fused_kernel

    cpu, dev = LSE_KERNELS["cpu"], torch.device("cpu")
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if mode == "autocast" else torch.no_grad()
    with ctx:
        assert check_fused_kernel(cpu, dev) is None
        assert check_fused_kernel(cpu, dev, torch.bfloat16, 128) is None


def test_dense_attention_row_by_hand():
    """T=2, steps 0 and 1: query 0 sees {k0[0], k1[0]}, query 1 sees {k0[0], k0[1], k1[1]}."""
    q = torch.tensor([[1.0], [2.0]]).view(1, 1, 2, 1)
    k0 = torch.tensor([[1.0], [0.0]]).view(1, 1, 2, 1)
    k1 = torch.tensor([[0.0], [1.0]]).view(1, 1, 2, 1)
    v0 = torch.tensor([[1.0], [2.0]]).view(1, 1, 2, 1)
    v1 = torch.tensor([[3.0], [4.0]]).view(1, 1, 2, 1)
    out = ttt_attention_dense(q, [k0, k1], [v0, v1], 1.0).flatten()
    e = torch.exp
    # query 0: scores k0[0]=1, k1[0]=0 -> values 1, 3
    want0 = (e(torch.tensor(1.0)) * 1 + e(torch.tensor(0.0)) * 3) / (e(torch.tensor(1.0)) + 1)
    # query 1: scores k0[0]=2, k0[1]=0, k1[1]=2 -> values 1, 2, 4
    s = torch.tensor([2.0, 0.0, 2.0])
    want1 = (torch.softmax(s, 0) * torch.tensor([1.0, 2.0, 4.0])).sum()
    torch.testing.assert_close(out, torch.stack([want0, want1]))


@pytest.mark.parametrize("impl", ["dense", "split", "fused"])
def test_ttt_step_equals_cached_inference(impl):
    """Step 1 of TTT at column t equals what inference computes for the first drafted token:
    the cache holds step-0 keys for columns 0..t, the new token sits at position t+1."""
    torch.manual_seed(0)
    m = Eagle3DraftModel(tiny_config(attn_impl=impl)).eval()
    B, T = 1, 6
    ids0 = torch.randint(0, 50, (B, T))
    ids1 = torch.randint(0, 50, (B, T))
    h0 = m.fuse_aux(torch.randn(B, T, 48))
    pos = torch.arange(T).unsqueeze(0)
    with torch.no_grad():
        hist = []
        p0 = m.ttt_step(ids0, h0, pos, hist)
        p1 = m.ttt_step(ids1, p0, pos + 1, hist)
        for t in range(T):
            cache = DraftKVCache()
            c0 = m.forward_cached(ids0[:, : t + 1], h0[:, : t + 1], pos[:, : t + 1], cache)
            torch.testing.assert_close(c0, p0[:, : t + 1], atol=1e-5, rtol=1e-5)
            c1 = m.forward_cached(ids1[:, t: t + 1], p0[:, t: t + 1], pos[:, t: t + 1] + 1, cache)
            torch.testing.assert_close(c1[:, 0], p1[:, t], atol=1e-5, rtol=1e-5)


def test_from_verifier_copies_shape():
    from transformers import LlamaConfig

    hf = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                     vocab_size=100, rms_norm_eps=1e-5)
    c = Eagle3Config.from_verifier(hf, draft_vocab_size=40, aux_layer_ids=(2, 2, 1))
    assert (c.hidden_size, c.head_dim, c.num_key_value_heads, c.max_position_embeddings,
            c.vocab_size, c.target_hidden_size, c.rope_scaling) == (64, 16, 2, 8192, 100, 64, None)


def test_save_load_roundtrip(tmp_path):
    from specdraft.artifacts.drafter import load_drafter
    from specdraft.models.io import save_drafter

    torch.manual_seed(1)
    m = Eagle3DraftModel(tiny_config())
    m.d2t.copy_(torch.arange(20) % 3)
    save_drafter(m, tmp_path / "d")
    m2 = load_drafter(tmp_path / "d")
    assert m2.config == m.config
    for k, v in m.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k]), k
