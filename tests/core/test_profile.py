"""The verifier profile (core/profile.py) and the drafter shape rules (Eagle3Config.from_profile),
on tiny configs of each family built in-process (no download)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from specdraft.core.errors import ConfigError
from specdraft.core.profile import VerifierProfile, resolve_profile
from specdraft.models.eagle3 import Eagle3Config


def tiny(cls_name: str, **kw):
    import transformers

    base = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=100, max_position_embeddings=4096)
    return getattr(transformers, cls_name)(**{**base, **kw})


def qwen3_moe():
    return tiny("Qwen3MoeConfig", intermediate_size=160, moe_intermediate_size=24, num_experts=8,
                num_experts_per_tok=2, head_dim=16)


def deepseek_v3():
    return tiny("DeepseekV3Config", intermediate_size=176, moe_intermediate_size=16,
                n_routed_experts=8, num_experts_per_tok=2, num_key_value_heads=4,
                kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
                v_head_dim=24, first_k_dense_replace=1,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                 "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "original_max_position_embeddings": 128})


def gpt_oss():
    return tiny("GptOssConfig", intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                head_dim=16)


def shape(hf, **kw) -> Eagle3Config:
    return Eagle3Config.from_verifier(hf, draft_vocab_size=20, aux_layer_ids=(1, 2, 3), **kw)


# ---------------------------------------------------------------- profile facts


def test_llama31_profile_records_rotary_and_round_trips():
    hf = tiny("LlamaConfig", intermediate_size=128, head_dim=16, tie_word_embeddings=True,
              rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 64})
    p = resolve_profile(hf)
    assert (p.model_type, p.n_layers, p.hidden_size, p.head_dim, p.norm_gain, p.final_state,
            p.tie_word_embeddings, p.max_position_embeddings, p.moe, p.mla) == \
        ("llama", 4, 64, 16, "w", "post_norm", True, 4096, None, None)
    assert p.rotary.rope_parameters() == {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    assert VerifierProfile.from_dict(p.to_dict()) == p
    assert VerifierProfile.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert resolve_profile(hf, backend="vllm").final_state == "engine_pre_norm+verifier_norm"


def test_family_facts():
    g3 = resolve_profile(tiny("Gemma3TextConfig", intermediate_size=128, head_dim=16,
                              rope_parameters={"full_attention": {"rope_type": "default",
                                                                  "rope_theta": 1e6},
                                               "sliding_attention": {"rope_type": "default",
                                                                     "rope_theta": 1e4}}))
    assert (g3.norm_gain, g3.rotary.theta, g3.rotary.layer_type) == ("1+w", 1e6, "full_attention")
    g2 = resolve_profile(tiny("Gemma2Config", intermediate_size=128, head_dim=16))
    assert (g2.norm_gain, g2.final_logit_softcapping) == ("1+w", 30.0)
    moe = resolve_profile(qwen3_moe()).moe
    assert (moe.n_experts, moe.experts_per_token, moe.expert_intermediate_size,
            moe.dense_intermediate_size) == (8, 2, 24, 160)
    ds = resolve_profile(deepseek_v3())
    assert (ds.mla.kv_lora_rank, ds.mla.qk_rope_head_dim, ds.mla.v_head_dim, ds.head_dim,
            ds.rotary_dim, ds.rotary.interleaved) == (16, 8, 24, 24, 8, True)
    assert ds.rotary.params["mscale_all_dim"] == 1.0
    oss = resolve_profile(gpt_oss())
    assert (oss.intermediate_size, oss.moe.expert_intermediate_size,
            oss.moe.dense_intermediate_size) == (None, 48, None)


def test_loaded_model_gives_head_rows_and_tying():
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    hf = tiny("LlamaConfig", intermediate_size=128, tie_word_embeddings=False)
    m = LlamaForCausalLM(hf)
    assert (resolve_profile(hf, model=m).vocab_size, resolve_profile(hf, model=m)
            .tie_word_embeddings) == (100, False)
    m.lm_head.weight = m.model.embed_tokens.weight  # tied in the model, whatever the config says
    assert resolve_profile(hf, model=m).tie_word_embeddings is True


@pytest.mark.parametrize("edit,field", [
    (dict(model_type="falcon"), "model_type 'falcon'"),
    (dict(rope_parameters={"rope_type": "superrope", "rope_theta": 1e4}),
     "`rope_parameters.rope_type` = 'superrope'"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                           "partial_rotary_factor": 1.5}), "`partial_rotary_factor` = 1.5"),
    (dict(rope_parameters={"rope_type": "default"}), "`rope_parameters.rope_theta`"),
    (dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     "without a `full_attention` entry"),
    (dict(num_local_experts=4), "whose `intermediate_size` specdraft cannot classify"),
    (dict(rms_norm_eps=None), "`rms_norm_eps`"),
])
def test_config_not_understood_is_refused_naming_the_field(edit, field):
    hf = SimpleNamespace(**tiny("LlamaConfig", intermediate_size=128).to_dict())  # as read
    for k, v in edit.items():
        setattr(hf, k, v)
    with pytest.raises(ConfigError, match="verifier config: .*" + _re(field)):
        resolve_profile(hf)


def _re(s: str) -> str:
    import re

    return re.escape(s)


def test_stored_profile_with_a_bad_key_is_one_clear_error():
    p = resolve_profile(tiny("LlamaConfig", intermediate_size=128)).to_dict()
    p["rotary"]["theta"] = "ten thousand"
    with pytest.raises(ConfigError, match=r"drafter config: key `rotary.theta`"):
        VerifierProfile.from_dict(p, source="drafter config")


def test_mismatches_name_the_field():
    a = resolve_profile(tiny("LlamaConfig", intermediate_size=128))
    b = resolve_profile(tiny("LlamaConfig", intermediate_size=128, rope_theta=20000.0))
    diff = a.mismatches(b)
    assert len(diff) == 1 and diff[0].startswith("rotary: ") and "20000.0" in diff[0]
    assert a.mismatches(resolve_profile(tiny("LlamaConfig", intermediate_size=128),
                                        backend="vllm")) == []  # the backend is not the verifier


# ---------------------------------------------------------------- drafter shape rules


def test_moe_drafters_take_the_dense_mlp_width():
    assert shape(qwen3_moe()).intermediate_size == 160  # never moe_intermediate_size 24
    c = shape(deepseek_v3())
    assert c.intermediate_size == 176  # never moe_intermediate_size 16


def test_gpt_oss_drafter_width_is_the_active_width_per_token():
    c = shape(gpt_oss())
    assert c.intermediate_size == 2 * 48  # experts_per_token x per-expert width, not 48
    assert c.intermediate_size > c.hidden_size


def test_mla_drafter_is_a_llama_layer_over_the_verifier_hidden_size():
    hf = deepseek_v3()
    assert hf.head_dim == 8  # transformers' DeepseekV3Config.head_dim is qk_rope_head_dim: a trap
    c = shape(hf)
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == \
        (64, 4, 4, 24)  # head_dim = v_head_dim
    assert c.rope_scaling["rope_type"] == "yarn" and c.rope_scaling["mscale_all_dim"] == 1.0
    assert c.partial_rotary_factor == 1.0 and c.rotary_dim == 24


def test_drafter_keeps_verifier_context_and_records_its_profile():
    hf = tiny("LlamaConfig", intermediate_size=128, tie_word_embeddings=True,
              max_position_embeddings=131072)
    c = shape(hf)
    assert c.max_position_embeddings == 131072
    assert VerifierProfile.from_dict(c.verifier_profile) == resolve_profile(hf)
    assert Eagle3Config.from_dict(c.to_dict()) == c
