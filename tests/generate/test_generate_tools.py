"""Tool calling end to end with a Qwen3-style template built in-process (tests/families): a
loopback server that renders each request as vLLM 0.32 does (the request's ``tools``, tool-call
``arguments`` parsed to objects) and answers with ``tool_calls`` when asked; then ``prepare``.

Asserted by hand: the request carries ``tools``/``tool_choice``; the data's tool call and its
result are in the history of the answer after them (kept, not regenerated); the verifier's
tool-call answer is stored whole; prepare's supervised tokens of that answer are the template's
rendering of exactly that call (the hand-written text below) and equal the server's ids; a
call the model generated with other spacing than the template renders stays the server's ids
and is counted (``tool_calls.rendered_differently`` in prepare's manifest); a
tool call before the last turn ends the sample, counted; local generation renders the tools and
the kept call and result into the prompt, exactly as the template does."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch

from specdraft.generate.config import GenerateConfig
from specdraft.generate.fakeserver import LoopbackServer, vllm_reply
from specdraft.generate.run import run as generate
from specdraft.prepare.config import PrepareConfig
from specdraft.prepare.run import run as prepare

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "families"))
from qwen3_template import QWEN3_TEMPLATE  # noqa: E402

QWEN3_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                "</tool_response>"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Rain probability in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
DATA_CALL = {"id": "c1", "type": "function",  # compact JSON, as data often has it
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
RESULT = '{"rain": 0.9}'
UMBRELLA = {"id": "umbrella", "tools": [WEATHER], "tool_choice": "auto", "messages": [
    {"role": "system", "content": "You help."},
    {"role": "user", "content": "Should I bring an umbrella in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [DATA_CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": RESULT},
    {"role": "assistant", "content": "Yes."},  # the data's answer: regenerated
    {"role": "user", "content": "And in Rome?"}]}
#: last user turn -> the call the fake verifier makes
CALLS = {"And in Rome?": {"city": "Rome"}, "Weather in Oslo?": {"city": "Oslo"}}
ANSWER = "Rain is likely: take an umbrella."
#: what the template renders for the call to get_weather(city=Rome), end of turn included
ROME_CALL_TEXT = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
                  '</tool_call><|im_end|>')
KWARGS = {"enable_thinking": False}


@pytest.fixture(scope="module")
def qwen3_tok(tmp_path_factory, smollm2_tokenizer_dir):
    """SmolLM2's tokenizer with Qwen3's think and tool tags and the Qwen3-style template."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_TOKENS])
    tok.chat_template = QWEN3_TEMPLATE
    out = tmp_path_factory.mktemp("qwen3_tools_tok")
    tok.save_pretrained(out)
    return out, tok


def as_vllm_renders(messages):
    """The request's messages as vLLM 0.32 hands them to the template (written here from its
    documented behaviour): ``reasoning`` also as ``reasoning_content``, tool-call ``arguments``
    JSON strings parsed to objects."""
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        if m.get("reasoning"):
            m["reasoning_content"] = m["reasoning"]
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"] or "{}")
        out.append(m)
    return out


def tools_server(tok, *, compact_call=False):
    """A handler rendering like vLLM (tools, chat_template_kwargs of the request): a call when
    the last user turn is in :data:`CALLS` (the generated text in compact JSON with
    ``compact_call``, while the parsed call is reported as vLLM's parser writes it), else
    :data:`ANSWER`; exact prompt and completion ids."""
    async def handler(body):
        prompt = tok.apply_chat_template(as_vllm_renders(body["messages"]), tools=body.get("tools"),
                                         add_generation_prompt=True, tokenize=False,
                                         **body.get("chat_template_kwargs", {}))
        last = body["messages"][-1]
        args = CALLS.get(last["content"]) if last["role"] == "user" else None
        if args is None:
            text, reply = ANSWER + "<|im_end|>", vllm_reply(body, content=ANSWER)
        else:
            sep = (",", ":") if compact_call else (", ", ": ")
            call = json.dumps({"name": "get_weather", "arguments": args}, separators=sep)
            text = f"<tool_call>\n{call}\n</tool_call><|im_end|>"
            reply = vllm_reply(body, tool_calls=[{"name": "get_weather", "arguments": args}])
        ids = tok(text, add_special_tokens=False)["input_ids"]
        reply.body["choices"][0]["token_ids"] = ids
        reply.body["prompt_token_ids"] = tok(prompt, add_special_tokens=False)["input_ids"]
        return reply
    return handler


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def generate_openai(tmp_path, handler, rows):
    prompts = write_rows(tmp_path / "p.jsonl", rows)
    server, out = LoopbackServer(handler), io.StringIO()
    with server as url:
        man = generate(GenerateConfig(prompts=prompts, run_dir=str(tmp_path / "run"),
                                      backend="openai", endpoint=[url], max_tokens=64,
                                      chat_template_kwargs=KWARGS, progress_interval_s=60),
                       stream=out)
    man.summary["printed"] = out.getvalue()
    return server.chat_bodies, man


def prepare_rows(tmp_path, **where):
    """``prepare`` of ``tmp_path/run`` (``where``: ``verifier=`` or ``tokenizer=``): rows and
    rejects."""
    import datasets

    prepare(PrepareConfig(run_dir=str(tmp_path / "run"), chat_template_kwargs=KWARGS,
                          **{k: str(v) for k, v in where.items()}))
    ds = datasets.load_from_disk(str(tmp_path / "run" / "prepare" / "dataset"))
    return list(ds), read_jsonl(tmp_path / "run" / "prepare" / "rejects.jsonl")


def test_tools_sent_data_call_kept_answer_call_stored_and_supervised(tmp_path, qwen3_tok,
                                                                     qwen3_verifier):
    _, tok = qwen3_tok
    bodies, man = generate_openai(tmp_path, tools_server(tok), [UMBRELLA])
    # every request of the conversation carries the row's tools and tool_choice
    assert [(b["tools"], b["tool_choice"]) for b in bodies] == [([WEATHER], "auto")] * 2
    system, user1, _, _, _, user2 = UMBRELLA["messages"]
    kept_call = {"role": "assistant", "content": "", "tool_calls": [DATA_CALL]}
    tool_result = {"role": "tool", "content": RESULT, "tool_call_id": "c1"}
    # the data's call and its result are the history of the first regenerated answer ...
    assert bodies[0]["messages"] == [system, user1, kept_call, tool_result]
    # ... and of the next turn, after the verifier's own answer
    assert bodies[1]["messages"] == [system, user1, kept_call, tool_result,
                                     {"role": "assistant", "content": ANSWER}, user2]
    (rec,) = read_jsonl(tmp_path / "run/generate/samples.jsonl")
    assert rec["tools"] == [WEATHER] and rec["tool_choice"] == "auto"
    assert rec["kept_turns"] == [2] and rec["stopped"] is None
    assert [t["message_index"] for t in rec["turns"]] == [4, 6]
    assert [t.get("tool_calls") for t in rec["turns"]] == [None, 1]
    assert rec["turns"][1]["finish_reason"] == "tool_calls"
    assert rec["messages"][6] == {
        "role": "assistant", "content": "", "reasoning": None, "tool_calls": [
            {"id": "chatcmpl-tool-0", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]}
    assert man.summary["turns"] == {"regenerated": 2, "kept": 1, "tool_call_answers": 1,
                                    "tool_results_kept": 1, "not_generated_after_tool_call": 0,
                                    "samples_with_tools": 1}
    assert ("tool calling: 1 samples, 2 turns regenerated, 1 data tool calls kept, 1 answers "
            "calling tools, 0 turns not generated after a tool call") in man.summary["printed"]

    rows, rejects = prepare_rows(tmp_path, verifier=qwen3_verifier)
    assert rejects == [] and [r["turn_index"] for r in rows] == [0, 1]  # the kept call: no row
    facts = json.loads((tmp_path / "run/prepare/manifest.json").read_text())["tool_calls"]
    assert (facts["turns"], facts["rendered_differently"]) == (1, 0)  # renders back exactly
    for row, turn in zip(rows, rec["turns"]):
        p, c = turn["prompt_token_ids"], turn["completion_token_ids"]
        assert row["input_ids"] == p + c  # the server's prompt (tools, kept call) and answer
        assert row["loss_mask"] == [0] * len(p) + [1] * len(c)
    supervised = [t for t, m in zip(rows[1]["input_ids"], rows[1]["loss_mask"]) if m]
    assert tok.decode(supervised) == ROME_CALL_TEXT
    assert supervised == tok(ROME_CALL_TEXT, add_special_tokens=False)["input_ids"]
    prompt = tok.decode(rows[0]["input_ids"][: rows[0]["loss_mask"].index(1)])
    assert prompt.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n'
        '{"rain": 0.9}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'
        '<think>\n\n</think>\n\n')
    assert prompt.startswith("<|im_start|>system\nYou help.\n\n# Tools") and \
        json.dumps(WEATHER) in prompt


def test_generated_call_that_renders_differently_is_the_servers_ids_and_counted(
        tmp_path, qwen3_tok, qwen3_verifier):
    _, tok = qwen3_tok
    generate_openai(tmp_path, tools_server(tok, compact_call=True), [UMBRELLA])
    rows, rejects = prepare_rows(tmp_path, verifier=qwen3_verifier)
    assert rejects == [] and [r["turn_index"] for r in rows] == [0, 1]
    # the row is what the model generated (compact JSON), not the template's rendering
    supervised = [t for t, m in zip(rows[1]["input_ids"], rows[1]["loss_mask"]) if m]
    assert tok.decode(supervised) == ROME_CALL_TEXT.replace(
        '"name": "get_weather", "arguments": {"city": "Rome"}',
        '"name":"get_weather","arguments":{"city":"Rome"}')
    facts = json.loads((tmp_path / "run/prepare/manifest.json").read_text())["tool_calls"]
    assert (facts["turns"], facts["rendered_differently"]) == (1, 1)
    (first,) = facts["first_rendered_differently"]
    assert first["id"] == "umbrella/1"
    assert '"arguments": {"city": "Rome"}' in first["detail"]  # rendered
    assert '"arguments":{"city":"Rome"}' in first["detail"]  # generated


def test_call_before_the_last_turn_ends_the_sample(tmp_path, qwen3_tok):
    _, tok = qwen3_tok
    row = {"id": "oslo", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo?"}, {"role": "user", "content": "Thanks."}]}
    bodies, man = generate_openai(tmp_path, tools_server(tok), [row])
    assert len(bodies) == 1 and "tool_choice" not in bodies[0]  # the row gives none
    (rec,) = read_jsonl(tmp_path / "run/generate/samples.jsonl")
    assert [m["role"] for m in rec["messages"]] == ["user", "assistant"]
    assert rec["stopped"] == ("turn 0 calls a tool the data has no result for: 1 later turn(s) "
                              "not generated")
    assert man.summary["turns"]["not_generated_after_tool_call"] == 1
    assert man.summary["turns"]["tool_call_answers"] == 1


@pytest.fixture(scope="module")
def qwen3_verifier(tmp_path_factory, qwen3_tok):
    """A 2-layer random Llama with the Qwen3-style tokenizer (its vocabulary size)."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    tokdir, tok = qwen3_tok
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=2048, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    out = tmp_path_factory.mktemp("qwen3_tools_verifier")
    LlamaForCausalLM(config).save_pretrained(out)
    for f in Path(tokdir).iterdir():
        shutil.copy(f, out / f.name)
    return out


def test_local_generation_renders_tools_and_the_kept_call(tmp_path, qwen3_tok, qwen3_verifier):
    _, tok = qwen3_tok
    prompts = write_rows(tmp_path / "p.jsonl", [UMBRELLA])
    generate(GenerateConfig(prompts=prompts, run_dir=str(tmp_path / "run"), backend="local",
                            verifier=str(qwen3_verifier), max_tokens=3, keep_truncated=True,
                            chat_template_kwargs=KWARGS, dtype="float32",
                            progress_interval_s=60), stream=io.StringIO())
    (rec,) = read_jsonl(tmp_path / "run/generate/samples.jsonl")
    assert rec["kept_turns"] == [2] and [t["message_index"] for t in rec["turns"]] == [4, 6]
    first = rec["turns"][0]
    # the prompt of the first answer, rendered here by the template itself with the tools and
    # the data's call (arguments as an object) and result
    messages = UMBRELLA["messages"][:2] + [
        {"role": "assistant", "content": "", "tool_calls": [
            {**DATA_CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": RESULT}]
    text = tok.apply_chat_template(messages, tools=[WEATHER], add_generation_prompt=True,
                                   tokenize=False, **KWARGS)
    assert first["prompt_token_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    assert '{"city": "Paris"}' in text and "<tool_response>\n" + RESULT in text
    rows, rejects = prepare_rows(tmp_path, verifier=qwen3_verifier)
    assert rejects == [] and len(rows) == 2
    for row, turn in zip(rows, rec["turns"]):
        assert row["input_ids"] == turn["prompt_token_ids"] + turn["completion_token_ids"]


CALL_ONLY = {"role": "assistant", "content": None, "tool_calls": [DATA_CALL]}
USER = {"role": "user", "content": "Hi"}
TOOL = {"role": "tool", "tool_call_id": "c1", "content": RESULT}


@pytest.mark.parametrize("body,script", [
    # a call without a result after it is an answer like any other: regenerated
    ([USER, CALL_ONLY, USER], [USER, None, USER, None]),
    # a call with its result is kept; the answer the data leaves out after it is generated
    ([USER, CALL_ONLY, TOOL], [USER, CALL_ONLY, TOOL, None]),
    # two results of one call share one answer; two user turns in a row get one answer each
    ([USER, CALL_ONLY, TOOL, TOOL, USER, USER], [USER, CALL_ONLY, TOOL, TOOL, None, USER, None,
                                                 USER, None]),
])
def test_tool_script_keeps_calls_that_a_result_follows(body, script):
    from specdraft.artifacts.prompts import tool_script

    assert list(tool_script(body)) == script


def test_lower_bound_of_a_tool_prompt_keeps_the_call_and_result():
    from specdraft.artifacts.prompts import parse_row
    from specdraft.generate.screen import lower_bound_messages

    p = parse_row(UMBRELLA, "f:1", fields={}, sampling={}, chat_template_kwargs={})
    system, user1, _, _, _, user2 = UMBRELLA["messages"]
    assert lower_bound_messages(p) == [
        system, user1, {"role": "assistant", "content": "", "tool_calls": [DATA_CALL]},
        {"role": "tool", "content": RESULT, "tool_call_id": "c1"},
        {"role": "assistant", "content": ""}, user2]
    # a row without tool calling keeps the id it had before tools were read
    plain = parse_row({"prompt": "x"}, "f:2", fields={}, sampling={}, chat_template_kwargs={})
    assert plain.script is None and plain.id == "3880d0901b79cf6deeae"  # as before tools
