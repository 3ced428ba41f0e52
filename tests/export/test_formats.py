"""Aux-id conventions per engine (converted back and compared) and config.json contents."""

import pytest

from specdraft.artifacts.formats import build_config, drafter_config_from_export
from specdraft.core.aux_ids import (hf_to_sglang_ids, hf_to_vllm_ids, sglang_capture_hf_ids,
                                    sglang_legacy_capture_hf_ids, vllm_capture_hf_ids)
from specdraft.models.eagle3 import Eagle3Config


def cfg(**kw):
    values = dict(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                  intermediate_size=16, rms_norm_eps=1e-5, rope_theta=1e4,
                  max_position_embeddings=8192, vocab_size=100, draft_vocab_size=10,
                  target_hidden_size=8, aux_layer_ids=(2, 15, 29))
    values.update(kw)
    return Eagle3Config(**values)


def test_vllm_ids_are_ours():
    # vLLM: id j = input to layer j = HF hidden_states[j]
    assert hf_to_vllm_ids([2, 15, 29]) == [2, 15, 29]
    assert vllm_capture_hf_ids(hf_to_vllm_ids([3, 10, 20])) == [3, 10, 20]


def test_sglang_default_set_is_written_minus_one_and_read_back_by_both_rules():
    # SmolLM2 (30 layers) default [2, 15, 27]: written [1, 14, 26]
    written = hf_to_sglang_ids([2, 15, 27])
    assert written == [1, 14, 26]
    assert sglang_capture_hf_ids(written) == [2, 15, 27]          # after PR #25454
    assert sglang_legacy_capture_hf_ids(written) == [2, 15, 27]   # before it


def test_sglang_other_first_id_follows_current_rule():
    written = hf_to_sglang_ids([3, 10, 20])
    assert written == [3, 10, 20]
    assert sglang_capture_hf_ids(written) == [3, 10, 20]


def test_engine_config_keys_and_both_id_spellings():
    c = build_config("sglang", cfg())
    assert c["architectures"] == ["LlamaForCausalLMEagle3"] and c["model_type"] == "llama"
    assert c["eagle_aux_hidden_state_layer_ids"] == [2, 15, 29]              # vLLM reads this
    assert c["eagle_config"] == {"use_aux_hidden_state": True,
                                 "eagle_aux_hidden_state_layer_ids": [1, 14, 28]}  # SGLang
    assert c["tie_word_embeddings"] is False and c["norm_before_residual"] is False
    assert (c["max_position_embeddings"], c["vocab_size"], c["draft_vocab_size"],
            c["target_hidden_size"]) == (8192, 100, 10, 8)
    v = build_config("vllm", cfg())
    assert v["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 29]


def test_speculators_config():
    c = build_config("speculators", cfg(norm_before_residual=False), verifier_name="/m",
                     verifier_architectures=["LlamaForCausalLM"], speculative_tokens=4)
    assert c["architectures"] == ["Eagle3Speculator"] and c["speculators_model_type"] == "eagle3"
    assert c["norm_before_residual"] is False
    s = c["speculators_config"]
    assert s["algorithm"] == "eagle3" and s["default_proposal_method"] == "greedy"
    assert s["proposal_methods"] == [{"proposal_type": "greedy", "speculative_tokens": 4}]
    assert s["verifier"] == {"name_or_path": "/m", "architectures": ["LlamaForCausalLM"]}
    assert c["transformer_layer_config"]["hidden_size"] == 8


@pytest.mark.parametrize("fmt", ["sglang", "vllm", "speculators"])
def test_config_round_trip(fmt):
    c = cfg(aux_layer_ids=(2, 9, 20), norm_before_residual=True)
    back = drafter_config_from_export(build_config(fmt, c, verifier_name="x"), fmt)
    assert back.to_dict() == {**c.to_dict(), "attn_impl": back.attn_impl}


def test_rotary_read_from_rope_parameters_alone_and_never_guessed():
    """A speculators checkpoint written by transformers 5 keeps the base only in
    `rope_parameters` (speculators' own trainer does): it is read from there, with its scaling;
    a layer config with no base anywhere is refused (KeyError), not read as 10000."""
    c = cfg(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 8192})
    out = build_config("speculators", c, verifier_name="x")
    layer = out["transformer_layer_config"]
    for key in ("rope_theta", "rope_scaling", "partial_rotary_factor"):
        layer.pop(key, None)
    back = drafter_config_from_export(out, "speculators")
    assert back.rope_theta == 500000.0 and back.rope_scaling == c.rope_scaling
    layer.pop("rope_parameters")
    with pytest.raises(KeyError, match="rope_theta"):
        drafter_config_from_export(out, "speculators")
