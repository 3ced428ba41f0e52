"""Files a user already has are read, not rejected: every shape the OpenAI chat format and
ShareGPT allow for text, hand-written, through the prompt reader (``generate --prompts``) and the
conversation reader (``prepare --data``).

OpenAI: ``content`` a string or a list of text parts (joined with ``"\\n"``, as vLLM renders
parts for a string-content template), ``null`` content on an assistant message with
``tool_calls``, ``tool`` results, ``name`` fields, ``system`` and ``developer`` roles. ShareGPT:
``conversations`` with ``from`` = ``system``/``human``/``gpt`` and ``value``.
"""

from __future__ import annotations

import json

import pytest

from specdraft.artifacts.prompts import parse_row, read_prompts

FIELDS = {k: k for k in ("messages", "conversations", "turns", "question", "prompt", "id",
                         "system")}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 2}"}}


def _prompt(row):
    p = parse_row(row, "f.jsonl:1", fields=FIELDS, sampling={}, chat_template_kwargs={})
    return p.system, p.turns


PROMPTS = [
    ("string_content", {"messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "2+2?"}]},
     ("Be brief.", ("2+2?",))),
    ("text_parts", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Read this:"}, {"type": "text", "text": "2+2?"}]}]},
     (None, ("Read this:\n2+2?",))),
    ("developer_is_system", {"messages": [{"role": "developer", "content": "Be brief."},
                                          {"role": "user", "content": "Hi"}]},
     ("Be brief.", ("Hi",))),
    ("system_as_parts", {"messages": [{"role": "system", "content": [
        {"type": "text", "text": "Be brief."}]}, {"role": "user", "content": "Hi"}]},
     ("Be brief.", ("Hi",))),
    ("name_fields", {"messages": [{"role": "system", "content": "S", "name": "ops"},
                                  {"role": "user", "content": "Hi", "name": "alice"}]},
     ("S", ("Hi",))),
    ("sharegpt", {"conversations": [{"from": "system", "value": "Be brief."},
                                    {"from": "human", "value": "2+2?"},
                                    {"from": "gpt", "value": "4"},
                                    {"from": "human", "value": "3+3?"}]},
     ("Be brief.", ("2+2?", "3+3?"))),
]


@pytest.mark.parametrize("case,row,want", PROMPTS, ids=[c[0] for c in PROMPTS])
def test_prompt_shapes_are_read(case, row, want):
    assert _prompt(row) == want


# conversations with tool calling: generate keeps the data's tool calls that a result follows
# and their results, and regenerates the other answers (None in the script); never flattened
TOOL_ROWS = [
    ("tool_call_round_trip", {"messages": [
        {"role": "user", "content": "Add 2 and 2."},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4"},
        {"role": "assistant", "content": "It is 4."},
        {"role": "user", "content": "Thanks"}]},
     ["user", "assistant", "tool", None, "user", None]),
    ("legacy_function_role", {"messages": [
        {"role": "user", "content": "Add."},
        {"role": "assistant", "content": None, "function_call": CALL["function"]},
        {"role": "function", "name": "add", "content": "4"}]},
     ["user", "assistant", "function", None]),
    ("sharegpt_tools", {"conversations": [
        {"from": "human", "value": "Add."}, {"from": "function_call", "value": "{}"},
        {"from": "observation", "value": "4"}, {"from": "gpt", "value": "4"}]},
     ["user", "assistant", "tool", None]),
]


@pytest.mark.parametrize("case,row,script", TOOL_ROWS, ids=[c[0] for c in TOOL_ROWS])
def test_prompt_with_tool_turns_keeps_its_script(case, row, script, tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_text(json.dumps(row) + "\n")
    read = read_prompts(path, fields=FIELDS, sampling={}, chat_template_kwargs={})
    (p,) = read.prompts
    assert read.rejected == [] and [m and m["role"] for m in p.script] == script
    assert (p.kept_turns, p.slots) == (1, script.count(None))
    # eval measures the first user turn only, before any tool turn
    assert _prompt(row)[1][0] in ("Add 2 and 2.", "Add.")


def test_text_parts_hash_like_the_joined_string():
    """A prompt in parts is the same sample (same id) as the string it joins to."""
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    plain = {"messages": [{"role": "user", "content": "Hi"}]}
    kw = dict(fields=FIELDS, sampling={}, chat_template_kwargs={})
    assert parse_row(parts, "a", **kw).id == parse_row(plain, "b", **kw).id


@pytest.fixture
def encode(smollm2_tokenizer_dir, tmp_path):
    """``encode(record) -> (rows, rejects)`` through prepare's per-record path."""
    from specdraft.prepare.config import PrepareConfig
    from specdraft.prepare.run import start_job

    config = PrepareConfig(run_dir=str(tmp_path), tokenizer=str(smollm2_tokenizer_dir),
                           data=str(tmp_path / "unused.jsonl"), max_seq_len=256)
    job, _, _ = start_job(config, tmp_path)

    def go(record):
        rows, rejects = len(job.writer._rows), len(job.rejects._pending)
        job.ids_seen.clear()
        job.add_record("c.jsonl:1", record)
        return ([(r["input_ids"], r["loss_mask"]) for r in job.writer._rows[rows:]],
                [(x["reason"], x["detail"]) for x in job.rejects._pending[rejects:]])

    yield go
    job.writer.abort()


U, A = {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}


def test_conversation_text_parts_give_the_string_rows(encode):
    plain, rejected = encode({"messages": [U, A]})
    assert len(plain) == 1 and not rejected
    parts = encode({"messages": [{"role": "user", "content": [{"type": "text", "text": "2+2?"}]},
                                 {"role": "assistant", "content": [
                                     {"type": "text", "text": "4"}]}]})
    assert parts == (plain, [])


def test_conversation_sharegpt_gives_the_openai_rows(encode):
    openai = encode({"messages": [{"role": "system", "content": "Be brief."}, U, A]})
    sharegpt = encode({"conversations": [{"from": "system", "value": "Be brief."},
                                         {"from": "human", "value": "2+2?"},
                                         {"from": "gpt", "value": "4"}]})
    assert len(openai[0]) == 1 and sharegpt == openai


def test_conversation_names_developer_and_tool_calls_are_read(encode):
    rows, rejected = encode({"messages": [
        {"role": "developer", "content": "Be brief.", "name": "ops"},
        {"role": "user", "content": "Add 2 and 2.", "name": "alice"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4"},
        {"role": "assistant", "content": "It is 4."}]})
    # SmolLM2's template does not render tool_calls: the call turn would supervise only its
    # end-of-turn token, so it is a counted reject; the answer after the tool result is a row
    assert [r for r, _ in rejected] == ["tool_calls_unsupported"] and len(rows) == 1
    assert "does not render its tool call 'add'" in rejected[0][1]
    assert sum(rows[0][1]) > 1
