"""Tiny random verifiers of every family users serve, built in-process from a config (nothing is
downloaded): 6 layers (default aux ids [2, 3, 5], which both engines spell), hidden 64, each family's own convention kept (rotary type and scaling,
partial rotary, norm gain, MoE, MLA). Used by tests/families and the teacher-check tests."""

from __future__ import annotations

from typing import Any

import torch

# Sliding-window layers keep their type, but the window is longer than any test sequence: eval's
# DynamicCache cannot roll back (crop) a sliding layer once its window is full (transformers
# 5.24 raises), so a 16-token window fails offline eval of prompts longer than 16 tokens.
SLIDING = 512

FAMILIES = ("llama31", "qwen3", "qwen3_moe", "gemma3", "gpt_oss", "phi3_partial", "deepseek_v3")


def tiny_config(family: str, vocab_size: int, **fields: Any) -> Any:
    """The HF config of ``family`` (one of :data:`FAMILIES`); ``fields``: bos/eos/pad ids, and
    any other field set on the config afterwards (e.g. ``head_dim=32`` for vLLM's CPU
    attention)."""
    import transformers as tf

    token_ids = {k: v for k, v in fields.items() if k.endswith("_token_id")}
    common = dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=6,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  tie_word_embeddings=False, **token_ids)
    config = _family_config(tf, family, common)
    for name, value in fields.items():
        if name not in token_ids:
            setattr(config, name, value)
    return config


def _family_config(tf: Any, family: str, common: dict[str, Any]) -> Any:
    if family == "llama31":  # Llama-3.1's rope: llama3 scaling of a 500k base
        return tf.LlamaConfig(**common, intermediate_size=128, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512})
    if family == "qwen3":
        return tf.Qwen3Config(**common, intermediate_size=128, head_dim=16)
    if family == "qwen3_moe":  # per-expert width 32, narrower than hidden 64
        return tf.Qwen3MoeConfig(**common, intermediate_size=128, head_dim=16, num_experts=4,
                                 num_experts_per_tok=2, moe_intermediate_size=32,
                                 decoder_sparse_step=1)
    if family == "gemma3":  # norm gain stored as an offset from 1: (1 + w) * x / rms(x)
        return tf.Gemma3TextConfig(**common, intermediate_size=128, head_dim=16,
                                   sliding_window=SLIDING, query_pre_attn_scalar=16)
    if family == "gpt_oss":  # YaRN rotary, attention sinks, MoE, alternating sliding window
        return tf.GptOssConfig(**common, intermediate_size=64, head_dim=16,
                               num_local_experts=4, num_experts_per_tok=2,
                               sliding_window=SLIDING,
                               rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                                "factor": 32.0, "beta_fast": 32.0,
                                                "beta_slow": 1.0, "truncate": False,
                                                "original_max_position_embeddings": 128})
    if family == "phi3_partial":  # rotary on half of each head (partial_rotary_factor 0.5)
        return tf.Phi3Config(**common, intermediate_size=128, partial_rotary_factor=0.5)
    if family == "deepseek_v3":  # MLA (low-rank q / kv, split rope dims) + routed MoE;
        common["num_key_value_heads"] = 4  # MLA has one k/v per head, as DeepSeek-V3 ships
        return tf.DeepseekV3Config(**common, intermediate_size=128, moe_intermediate_size=32,
                                   n_routed_experts=4, num_experts_per_tok=2,
                                   n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                                   topk_group=1, q_lora_rank=32, kv_lora_rank=16,
                                   qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)
    raise ValueError(f"unknown family {family!r}")


@torch.no_grad()
def tiny_model(family: str, vocab_size: int, *, seed: int = 0, sharpen: float = 20.0,
               **fields: Any) -> Any:
    """A random ``family`` causal LM in fp32, eval mode, with every RMSNorm weight randomised
    (so a norm applied with the wrong gain or skipped changes the result) and ``lm_head``
    scaled by ``sharpen`` (a peaked teacher, as trained verifiers have)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, vocab_size, **fields))
    for name, p in model.named_parameters():
        if "norm" in name and p.dim() == 1:
            p.copy_(torch.randn_like(p) * 0.3 + (0.0 if family == "gemma3" else 1.0))
    model.lm_head.weight.mul_(sharpen)
    return model.eval()
