"""A Kimi-K2.5-shaped verifier, tiny and random, built in-process from a config (nothing is
downloaded): the text model of Kimi-K2.5 is DeepSeek-V3's layout, so this is a DeepSeek-V3 with

- MLA with the widths vLLM 0.32's CPU MLA backend runs: ``kv_lora_rank`` 512 + ``qk_rope_head_dim``
  64 = the latent width 576 its decode kernel supports
  (``vllm/v1/attention/backends/mla/cpu_mla.py``), ``qk_nope_head_dim`` 32, ``v_head_dim`` 32,
  a low-rank query (``q_lora_rank`` 32); rotary interleaved (``rope_interleave``), as shipped;
- YaRN rotary as Kimi-K2 ships it (``rope_theta`` 50000, factor 32 over 4096 positions,
  ``beta_fast`` = ``beta_slow`` = 1, ``mscale`` = ``mscale_all_dim`` = 1: the attention scale is
  multiplied by ``(0.1·ln 32 + 1)²``);
- MoE with a shared expert, dense first layer (``first_k_dense_replace`` 1), 4 routed experts,
  2 per token, sigmoid scores with a random ``e_score_correction_bias`` (so a router that ignores
  the bias or scores with softmax routes other experts), ``routed_scaling_factor`` 2.827;
- the routing keys DeepSeek-V3 checkpoints carry, ``scoring_func: sigmoid`` and
  ``topk_method: noaux_tc``: transformers' DeepseekV3 always routes that way, vLLM reads the keys
  and defaults to softmax without them (a silent disagreement; specdraft refuses such a config,
  ``specdraft.core.profile.check_engine_routing``);
- a thinking chat template (:data:`KIMI_THINK_TEMPLATE`): the generation prompt opens
  ``<think>\n``, so every answer starts inside its reasoning, as DeepSeek-R1 and Kimi's thinking
  models answer (``<think>``/``</think>`` are special tokens: the ``think_tokenizer_dir`` fixture
  of ``tests/conftest.py``, SmolLM2's tokenizer plus the two).

Architecture name: ``DeepseekV3ForCausalLM`` with ``model_type`` ``deepseek_v3``. Kimi-K2.5's own
class (``KimiK25ForConditionalGeneration``) always declares a vision tower; Kimi-K2's text
checkpoints say ``model_type: kimi_k2``, which vLLM maps to ``DeepseekV3Config`` but transformers
5.24 (specdraft's venv) does not know, so the transformers backend could not load it: the
stand-in both backends load is plain ``deepseek_v3``. specdraft's profile treats ``kimi_k2``
exactly as ``deepseek_v3``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

#: The rotary as Kimi-K2's config.json spells it (HF ``rope_scaling`` keys).
KIMI_YARN = {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 32.0,
             "original_max_position_embeddings": 4096, "beta_fast": 1.0, "beta_slow": 1.0,
             "mscale": 1.0, "mscale_all_dim": 1.0}
LAYERS = 4
HIDDEN = 64

# Our own text: the reasoning of assistant turns after the last user message is rendered as
# "<think>\n{reasoning}\n</think>\n\n{answer}"; the generation prompt ends inside "<think>\n"
# (so the server's prompt_token_ids end with it and the completion starts with the reasoning).
KIMI_THINK_TEMPLATE = (
    "{%- set st = namespace(q=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set st.q = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\n' -}}"
    "{%- if loop.index0 > st.q -%}"
    "{{- '<think>\n' + (m.reasoning_content or '') | trim + '\n</think>\n\n' -}}"
    "{%- endif -%}"
    "{{- m.content + '<|im_end|>\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n<think>\n' -}}{%- endif -%}"
)


def kimi_config(vocab_size: int, *, init: float = 0.02, **token_ids: Any) -> Any:
    """The ``transformers.DeepseekV3Config`` of the fixture (``token_ids``: bos/eos/pad ids).
    ``init``: the weights' std (``initializer_range``). At 0.02 the greedy answers loop (5-12
    distinct tokens in 30, measured on 8 random prompts): a drafter memorises them from the
    tokens alone, whatever aux layers it reads. At 0.3 they do not (28-30 distinct in 30),
    which the overfit gate with wrong aux ids needs (``tests/engine/test_kimi_gate.py``)."""
    import transformers as tf

    config = tf.DeepseekV3Config(
        vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=128,
        moe_intermediate_size=32, num_hidden_layers=LAYERS, num_attention_heads=2,
        num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=2.827,
        norm_topk_prob=True, q_lora_rank=32, kv_lora_rank=512, qk_rope_head_dim=64,
        qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=131072,
        initializer_range=init,
        rope_parameters=dict(KIMI_YARN), rope_interleave=True, tie_word_embeddings=False,
        **token_ids)
    config.architectures = ["DeepseekV3ForCausalLM"]
    config.scoring_func = "sigmoid"  # read by vLLM (deepseek_v2.py), implied by transformers
    config.topk_method = "noaux_tc"
    return config


@torch.no_grad()
def make_kimi_verifier(out: Path, tokenizer_dir: Path, *, seed: int = 0) -> Path:
    """Save the fixture (fp32 weights, every RMSNorm gain and the routers' correction bias
    random) with the tokenizer of ``tokenizer_dir`` (which must hold ``<think>`` and
    ``</think>``) and :data:`KIMI_THINK_TEMPLATE` under ``out``; returns ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert tok.convert_tokens_to_ids(["<think>", "</think>"]) == [len(tok) - 2, len(tok) - 1]
    tok.chat_template = KIMI_THINK_TEMPLATE
    torch.manual_seed(seed)
    config = kimi_config(len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    for name, p in model.named_parameters():
        if "norm" in name and p.dim() == 1:
            p.copy_(torch.randn_like(p) * 0.3 + 1.0)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(torch.randn_like(b) * 0.5)
    for name, p in model.named_parameters():
        if name.endswith("e_score_correction_bias"):
            p.copy_(torch.randn_like(p) * 0.5)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
