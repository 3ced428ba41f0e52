"""Strategies and seed files of the fuzz suite (``test_fuzz_*.py``).

Every reader of user files is fed three kinds of input: arbitrary bytes, arbitrary JSON values
(and chat-shaped records built from them), and real files mutated byte by byte. The settings
profile ``specdraft-fuzz`` is derandomized (the same examples on every run, so CI is
reproducible) and bounded by ``max_examples`` per test, so the whole suite stays within a few
minutes on a busy 2-core machine. Set ``SPECDRAFT_FUZZ_EXAMPLES=N`` to run N examples per test
(a longer local hunt); examples that ever failed are replayed from ``corpus/`` by
``test_fuzz_corpus.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

CORPUS = Path(__file__).parent / "corpus"
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

settings.register_profile(
    "specdraft-fuzz", derandomize=True, database=None, deadline=None, print_blob=True,
    max_examples=int(os.environ.get("SPECDRAFT_FUZZ_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture])
FUZZ = settings.get_profile("specdraft-fuzz")


def examples(n: int) -> settings:
    """The fuzz profile with at most ``n`` examples (scaled by ``SPECDRAFT_FUZZ_EXAMPLES``)."""
    scale = int(os.environ.get("SPECDRAFT_FUZZ_EXAMPLES", "60")) / 60
    return settings(FUZZ, max_examples=max(1, int(n * scale)))


scalars = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=4)
                           | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)

ROLES = ["system", "developer", "user", "assistant", "tool", "function", "human", "gpt", "",
         "USER", "wizard"]
texts = st.text(max_size=30) | st.sampled_from(
    ["<think>a</think>b", "</think>", "<think>", "<|im_end|>", "<|im_start|>user\n", "{{ x }}",
     "{% raw %}", "\x00", "\ud7ff", "😀" * 3])
contents = (texts | st.none() | json_values
            | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]),
                                               "text": texts | json_values}), max_size=3))
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(ROLES) | json_values, "content": contents},
    optional={"name": texts | json_values, "reasoning_content": texts | json_values,
              "tool_calls": json_values, "finish_reason": texts | json_values,
              "completion_token_ids": st.lists(st.integers(-5, 10**6), max_size=5) | json_values})
sharegpt = st.fixed_dictionaries(
    {"from": st.sampled_from(["human", "gpt", "system", "function_call", "observation", "x"])
     | json_values, "value": texts | json_values})
records = st.fixed_dictionaries(
    {}, optional={"id": texts | json_values, "messages": st.lists(messages, max_size=4)
                  | json_values, "conversations": st.lists(sharegpt, max_size=4) | json_values,
                  "turns": json_values | st.lists(st.fixed_dictionaries(
                      {"message_index": st.integers(-2, 5) | json_values},
                      optional={"completion_token_ids": json_values | st.lists(
                          st.integers(-5, 10**6), max_size=4),
                          "prompt_token_ids": json_values, "finish_reason": json_values}),
                      max_size=3),
                  "tools": json_values | texts, "chat_template_kwargs": json_values,
                  "question": texts | json_values, "prompt": texts | json_values,
                  "system": texts | json_values})


def seed_lines() -> list[bytes]:
    """Real lines to mutate: chat records like the robustness fixtures, and the first lines of
    the shared GSM8K prompts when present."""
    lines = [json.dumps(r).encode() for r in (
        {"id": "good", "messages": [{"role": "user", "content": "Hi"},
                                    {"role": "assistant", "content": "Hello!"}]},
        {"id": "good2", "conversations": [{"from": "human", "value": "2+2?"},
                                          {"from": "gpt", "value": "4"}]},
        {"question": "What is 2+2?"}, {"turns": ["Name a colour.", "Another?"]},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]})]
    gsm8k = DATA / "gsm8k" / "test.jsonl"
    if gsm8k.exists():
        with open(gsm8k, "rb") as f:
            lines += [f.readline().rstrip(b"\n") for _ in range(3)]
    return lines


@st.composite
def mutated_files(draw) -> bytes:
    """A few real lines, then byte flips, cuts, inserted brackets/quotes/NULs and duplicates."""
    lines = draw(st.lists(st.sampled_from(seed_lines()), min_size=1, max_size=4))
    data = bytearray(b"\n".join(lines) + b"\n")
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["flip", "cut", "insert", "deep", "dup"]))
        if op == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del data[at:at + draw(st.integers(1, 40))]
        elif op == "insert":
            data[at:at] = draw(st.sampled_from([b"[", b"{", b'"', b"\x00", b"\xff", b"\r\n",
                                                b"\n", b"\xef\xbb\xbf", b"1e999", b",", b"]"]))
        elif op == "deep":
            data[at:at] = b"[" * draw(st.sampled_from([300, 5000, 100000]))
        else:
            data[at:at] = data[max(0, at - 50):at]
    return bytes(data)


any_bytes = st.binary(max_size=300) | mutated_files()
jsonl_of_values = st.lists(json_values, min_size=1, max_size=4).map(
    lambda vs: b"\n".join(json.dumps(v).encode() for v in vs) + b"\n")
jsonl_of_records = st.lists(records, min_size=1, max_size=4).map(
    lambda rs: b"\n".join(json.dumps(r).encode() for r in rs) + b"\n")
