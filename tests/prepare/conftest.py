"""Fixtures for prepare tests: the SmolLM2 tokenizer with <think>/</think> added, and chat
templates written for these tests (ChatML markup; Qwen3-like thinking behaviour)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def write_generate(run_dir: Path, records: list[dict]) -> Path:
    """RUN/generate/samples.jsonl in the shape of docs/run-dir.md, plus a manifest."""
    gen = Path(run_dir) / "generate"
    gen.mkdir(parents=True, exist_ok=True)
    with open(gen / "samples.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    (gen / "manifest.json").write_text(json.dumps({"stage": "generate"}))
    return gen / "samples.jsonl"


def sample(sample_id: str, messages: list[dict], *, kwargs: dict | None = None,
           tools: list | None = None, finish: str = "stop", token_ids=None) -> dict:
    """A generate record whose assistant messages are all generated turns."""
    turns = [{"message_index": i, "finish_reason": finish, "reasoning_source": "none",
              "usage": None, "completion_token_ids": token_ids, "latency_s": 0.1}
             for i, m in enumerate(messages) if m["role"] == "assistant"]
    return {"id": sample_id, "messages": messages, "turns": turns, "tools": tools,
            "chat_template_kwargs": kwargs or {}, "sampling": {"temperature": 0.0},
            "model": "smollm2", "endpoint": "test", "backend": "openai"}


@pytest.fixture
def gen_helpers():
    """(write_generate, sample) for building RUN/generate by hand."""
    return write_generate, sample


@pytest.fixture(scope="session")
def think_template() -> str:
    return THINK_TEMPLATE
