"""Fixtures for prepare tests: writing RUN/generate by hand (the think tokenizer and templates
are in tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stubs import write_stub_manifest


def write_generate(run_dir: Path, records: list[dict]) -> Path:
    """RUN/generate/samples.jsonl in the shape of docs/run-dir.md, plus a manifest."""
    gen = Path(run_dir) / "generate"
    gen.mkdir(parents=True, exist_ok=True)
    with open(gen / "samples.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    write_stub_manifest(gen, "generate")
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


