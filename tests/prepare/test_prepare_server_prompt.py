"""generate → prepare against a vLLM-shaped server that renders with the real tokenizer and a
chat template that KEEPS the reasoning of earlier assistant turns: the prompt prepare renders for
turn 2 is exactly the ``prompt_token_ids`` the server reported, and a server that saw a different
history is caught as a counted ``prompt_mismatch`` reject (never a silent row)."""

import io
import json

import pytest

from specdraft.generate.config import GenerateConfig
from specdraft.generate.fakeserver import LoopbackServer, vllm_reply
from specdraft.generate.run import run as generate
from specdraft.prepare.config import PrepareConfig
from specdraft.prepare.run import run as prepare


@pytest.fixture(scope="module")
def keep_history_tok(think_tokenizer_dir, think_template, tmp_path_factory):
    """The think tokenizer with a template that renders every assistant turn's reasoning."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(think_tokenizer_dir)
    tok.chat_template = think_template.replace("{%- if loop.index0 > st.q -%}",
                                               "{%- if true -%}")
    assert tok.chat_template != think_template
    out = tmp_path_factory.mktemp("keep_history_tok")
    tok.save_pretrained(out)
    return out, tok


def vllm_like(tok, *, drop_history_reasoning=False, seen=None):
    """A handler rendering like vLLM 0.32: an assistant message's `reasoning` reaches the template
    as `reasoning` and `reasoning_content`; returns the exact prompt and completion ids."""
    async def handler(body):
        messages = []
        for m in body["messages"]:
            m = dict(m)
            if m["role"] == "assistant" and m.get("reasoning") and not drop_history_reasoning:
                m["reasoning_content"] = m["reasoning"]
            else:
                m.pop("reasoning", None)
                m.pop("reasoning_content", None)
            messages.append(m)
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        n = len(body["messages"])
        ids = tok(f"<think>\nplan {n}\n</think>\n\nans {n}<|im_end|>",
                  add_special_tokens=False)["input_ids"]
        reply = vllm_reply(body, content=f"ans {n}", reasoning=f"plan {n}", token_ids=ids)
        reply.body["prompt_token_ids"] = prompt_ids
        if seen is not None:
            seen.append(prompt_ids)
        return reply
    return handler


def generate_then_prepare(tmp_path, tokdir, handler):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "s0", "turns": ["First question?", "And then?"]}) + "\n")
    run_dir = tmp_path / "run"
    with LoopbackServer(handler) as url:
        generate(GenerateConfig(prompts=str(prompts), run_dir=str(run_dir), backend="openai",
                                endpoint=[url], max_tokens=32, progress_interval_s=60),
                 stream=io.StringIO())
    manifest = prepare(PrepareConfig(run_dir=str(run_dir), tokenizer=str(tokdir)))
    from datasets import load_from_disk

    rows = load_from_disk(str(run_dir / "prepare" / "dataset"))
    rejects = [json.loads(l) for l in (run_dir / "prepare" / "rejects.jsonl").open()]
    return manifest, rows, rejects


def test_turn2_prompt_is_the_servers(tmp_path, keep_history_tok):
    tokdir, tok = keep_history_tok
    seen = []
    manifest, rows, rejects = generate_then_prepare(tmp_path, tokdir, vllm_like(tok, seen=seen))
    assert rejects == [] and len(rows) == 2
    assert "plan 1" in tok.decode(seen[1])  # the server rendered turn 1's reasoning in history
    for row, server_prompt in zip(rows, seen):
        n = len(server_prompt)
        assert row["input_ids"][:n] == server_prompt
        assert row["loss_mask"][:n] == [0] * n and all(row["loss_mask"][n:])
    assert manifest["chat_format"]["history_reasoning"] == "kept"


def test_server_saw_other_history_is_rejected(tmp_path, keep_history_tok):
    tokdir, tok = keep_history_tok
    handler = vllm_like(tok, drop_history_reasoning=True)
    manifest, rows, rejects = generate_then_prepare(tmp_path, tokdir, handler)
    assert len(rows) == 1 and rows[0]["turn_index"] == 0
    assert [(r["id"], r["reason"]) for r in rejects] == [("s0/1", "prompt_mismatch")]
    assert manifest["counts"]["rejected"] == {"prompt_mismatch": 1}
