"""EAGLE-3.1 norms and the Qwen3 layer: checkpoint names, a hand-written reference forward of the
chain the eval drafter runs, and TTT == cached inference with every option on."""

import math

import pytest
import torch

from specdraft.eval.specdec import EagleDrafter
from specdraft.models.eagle3 import (DRAFT_LAYER_BY_FAMILY, DraftKVCache, Eagle3Config,
                                     Eagle3DraftModel, default_draft_layer)

OPTIONS = {
    "eagle3": {},
    "norm_before_fc": {"norm_before_fc": True},
    "fc_norm": {"fc_norm": True},
    "norm_output": {"norm_output": True},
    "eagle3.1": {"norm_before_fc": True, "fc_norm": True, "norm_output": True},
    "qwen3": {"draft_layer": "qwen3"},
    "qwen3+3.1+nbr": {"draft_layer": "qwen3", "norm_before_fc": True, "fc_norm": True,
                      "norm_output": True, "norm_before_residual": True},
}


def tiny(**kw) -> Eagle3Config:
    values = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  intermediate_size=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                  max_position_embeddings=4096, vocab_size=50, draft_vocab_size=50,
                  target_hidden_size=16, aux_layer_ids=(1, 2, 3))
    values.update(kw)
    return Eagle3Config(**values)


def random_model(c: Eagle3Config, seed: int = 0) -> Eagle3DraftModel:
    """Every tensor random, norm gains too (a gain of 1 would hide a norm applied twice)."""
    torch.manual_seed(seed)
    m = Eagle3DraftModel(c).double()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 1.0) + (1.0 if p.dim() == 1
                                                                           else 0.0))
    return m.eval()


def test_checkpoint_names_of_the_options():
    """vLLM's names: ``input_norm`` over n_aux*Ht, ``fc_norm.{i}`` over Ht, per-head q/k norms."""
    m = Eagle3DraftModel(tiny(**OPTIONS["qwen3+3.1+nbr"]))
    base = set(Eagle3DraftModel(tiny()).checkpoint_state())
    extra = {k: tuple(v.shape) for k, v in m.checkpoint_state().items() if k not in base}
    assert extra == {"input_norm.weight": (48,), "fc_norm.0.weight": (16,),
                     "fc_norm.1.weight": (16,), "fc_norm.2.weight": (16,),
                     "midlayer.self_attn.q_norm.weight": (8,),
                     "midlayer.self_attn.k_norm.weight": (8,)}


# ------------------------------------------------------------------ reference, written by hand
def rms(x, w, eps=1e-6):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def rope(x, pos, theta=10000.0):
    """x [heads, d] at integer position ``pos``: neox halves."""
    d = x.shape[-1]
    ang = pos / theta ** (torch.arange(0, d, 2, dtype=x.dtype) / d)  # [d/2]
    cos, sin = torch.cos(ang).repeat(2), torch.sin(ang).repeat(2)
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


class Reference:
    """One column at a time, every product written out; ``sd`` = the model's state dict."""

    def __init__(self, sd, c: Eagle3Config):
        self.w, self.c, self.keys, self.values = sd, c, [], []

    def fuse(self, aux):  # [n_aux*Ht]
        w, c = self.w, self.c
        if c.norm_before_fc:
            aux = rms(aux, w["input_norm.weight"])
        if c.fc_norm:
            Ht = c.target_hidden_size
            aux = torch.cat([rms(aux[i * Ht:(i + 1) * Ht], w[f"fc_norm.{i}.weight"])
                             for i in range(c.n_aux)])
        return w["fc.weight"] @ aux

    def column(self, token, h, pos):
        """-> (logits [K], fed-back state [H])."""
        w, c, L = self.w, self.c, "midlayer."
        hn = rms(h, w[L + "hidden_norm.weight"])
        z = torch.cat([rms(w["embed_tokens.weight"][token], w[L + "input_layernorm.weight"]), hn])
        nh, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q = (w[L + "self_attn.q_proj.weight"] @ z).view(nh, d)
        k = (w[L + "self_attn.k_proj.weight"] @ z).view(nkv, d)
        v = (w[L + "self_attn.v_proj.weight"] @ z).view(nkv, d)
        if c.draft_layer == "qwen3":
            q, k = rms(q, w[L + "self_attn.q_norm.weight"]), rms(k, w[L + "self_attn.k_norm.weight"])
        self.keys.append(rope(k, pos))
        self.values.append(v)
        q = rope(q, pos)
        heads = []
        for i in range(nh):
            j = i // (nh // nkv)
            s = torch.stack([q[i] @ kk[j] for kk in self.keys]) / math.sqrt(d)
            heads.append(sum(p * vv[j] for p, vv in zip(torch.softmax(s, 0), self.values)))
        r = (hn if c.norm_before_residual else h) + w[L + "self_attn.o_proj.weight"] @ torch.cat(heads)
        x = rms(r, w[L + "post_attention_layernorm.weight"])
        g, u = w[L + "mlp.gate_proj.weight"] @ x, w[L + "mlp.up_proj.weight"] @ x
        out = r + w[L + "mlp.down_proj.weight"] @ (g * torch.sigmoid(g) * u)
        normed = rms(out, w["norm.weight"])
        return w["lm_head.weight"] @ normed, normed if c.norm_output else out


@pytest.mark.parametrize("name", list(OPTIONS))
def test_eval_drafter_chain_equals_the_hand_written_reference(name):
    """The eval drafter (``EagleDrafter``: observe 5 prompt columns, propose 3 greedy drafts)
    against :class:`Reference` in float64 (the model's rotary table is float32, hence 2e-5):
    the logits of every draft step and the drafts."""
    c = tiny(**OPTIONS[name])
    m = random_model(c)
    torch.manual_seed(1)
    T = 5
    aux = torch.randn(T, c.n_aux * c.target_hidden_size, dtype=torch.float64)
    tokens = torch.randint(0, c.vocab_size, (T,))
    ref = Reference(m.state_dict(), c)
    for t in range(T):
        logits, h = ref.column(int(tokens[t]), ref.fuse(aux[t]), t)
    want_logits, want_drafts = [], []
    for j in range(3):
        want_logits.append(logits)
        want_drafts.append(int(logits.argmax()))
        if j < 2:
            logits, h = ref.column(want_drafts[-1], h, T + j)
    drafter = EagleDrafter(m)
    drafter.observe(0, aux, tokens)
    seen = []
    real_logits = m.logits
    m.logits = lambda x: seen.append(real_logits(x)[0, -1]) or real_logits(x)
    drafts, _ = drafter.propose(tokens, 3, 0.0, None)
    assert drafts.tolist() == want_drafts
    for got, want in zip(seen, want_logits):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)  # fp32 rotary table


def test_each_norm_changes_the_drafts_logits():
    """Switching a field on changes the third draft step's logits (it is not silently inert)."""
    def third_logits(c):
        m = random_model(c)
        torch.manual_seed(1)
        aux = torch.randn(1, 4, c.n_aux * c.target_hidden_size, dtype=torch.float64)
        cache = DraftKVCache()
        out = m.forward_cached(torch.tensor([[1, 2, 3, 4]]), m.fuse_aux(aux),
                               torch.arange(4)[None], cache)[:, -1:]
        for j in range(2):
            out = m.forward_cached(torch.tensor([[5 + j]]), m.feedback(out),
                                   torch.tensor([[4 + j]]), cache)
        return m.logits(out)

    base = third_logits(tiny())
    for name in ("norm_before_fc", "fc_norm", "norm_output", "qwen3"):
        assert (third_logits(tiny(**OPTIONS[name])) - base).abs().max() > 1e-3, name


@pytest.mark.parametrize("name", ["eagle3.1", "qwen3+3.1+nbr"])
def test_ttt_steps_equal_cached_inference(name):
    """Training (``ttt_step`` + ``feedback``, as ``train/objective.py`` unrolls it) and eval
    (``forward_cached`` + ``feedback``) compute the same step-2 state at every column."""
    c = tiny(**OPTIONS[name], attn_impl="dense")
    m = random_model(c)  # float64: any difference beyond rounding is a different function
    torch.manual_seed(2)
    B, T = 1, 6
    ids = [torch.randint(0, 50, (B, T)) for _ in range(3)]
    h0 = m.fuse_aux(torch.randn(B, T, 48, dtype=torch.float64))
    pos = torch.arange(T)[None]
    with torch.no_grad():
        hist, h, outs = [], h0, []
        for k in range(3):
            outs.append(m.ttt_step(ids[k], h, pos + k, hist))
            h = m.feedback(outs[-1])
        for t in range(T):
            cache = DraftKVCache()
            o = m.forward_cached(ids[0][:, : t + 1], h0[:, : t + 1], pos[:, : t + 1], cache)
            o = o[:, -1:]
            for k in (1, 2):
                o = m.forward_cached(ids[k][:, t: t + 1], m.feedback(o), pos[:, t: t + 1] + k,
                                     cache)
                torch.testing.assert_close(o[:, 0], outs[k][:, t], atol=1e-9, rtol=1e-9)


def test_default_draft_layer_rule():
    assert DRAFT_LAYER_BY_FAMILY == {"qwen3": "qwen3", "qwen3_moe": "qwen3"}
    assert [default_draft_layer(t) for t in ("qwen3", "qwen3_moe", "llama", "gemma3")] == \
        ["qwen3", "qwen3", "llama", "llama"]


def test_unknown_field_of_a_specdraft_config_is_refused_by_name():
    d = tiny().to_dict() | {"norm_output_scale": 2.0}
    with pytest.raises(ValueError, match="norm_output_scale"):
        Eagle3Config.from_dict(d)
    with pytest.raises(ValueError, match="draft_layer 'gemma'"):
        tiny(draft_layer="gemma")
