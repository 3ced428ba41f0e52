"""The local backend: batched left-padded greedy generation equals an independent unbatched
argmax loop; records have the samples.jsonl shape; an already-loaded verifier is reused."""

import io
import json

import pytest
import torch

from specdraft.generate.config import GenerateConfig
from specdraft.generate.local_backend import LocalBackend, cut_at_stop
from specdraft.generate.run import run


@pytest.fixture(scope="module")
def tiny(tiny_verifier_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_verifier_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_verifier_dir)


def greedy_reference(model, tok, messages, n):
    """Unbatched, no padding, no ``generate``: argmax one token at a time."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]  # [1, T]
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(ids).logits[0, -1].argmax())  # logits [1, T, V]
            out.append(nxt)
            if nxt == tok.eos_token_id:
                break
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def test_cut_at_stop():
    assert cut_at_stop([5, 6, 2, 9], [2]) == ([5, 6, 2], "stop")
    assert cut_at_stop([5, 6, 9], [2, 7]) == ([5, 6, 9], "length")


def test_batched_greedy_equals_unbatched_reference(tiny):
    model, tok = tiny
    convs = [[{"role": "user", "content": "Hi"}],
             [{"role": "user", "content": "A much longer question about apples and pears?"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]]
    backend = LocalBackend(model, tok, max_tokens=6)
    outs = backend.generate(convs)
    for conv, out in zip(convs, outs):
        ref = greedy_reference(model, tok, conv, 6)
        assert out.completion_token_ids == ref
        assert out.finish_reason == ("stop" if ref[-1] == tok.eos_token_id else "length")
        text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        assert out.prompt_token_ids == tok(text, add_special_tokens=False)["input_ids"]
        assert out.usage["completion_tokens"] == len(ref)
        assert out.message["content"] == tok.decode(
            ref[:-1] if out.finish_reason == "stop" else ref, skip_special_tokens=False)


def test_run_with_loaded_verifier_writes_records(tiny, tmp_path):
    model, tok = tiny
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question": q}) + "\n" for q in ("a?", "b?", "c?")))
    config = GenerateConfig(prompts=str(prompts), run_dir=str(tmp_path / "run"), max_tokens=4,
                            batch_size=2, verifier="tiny")
    m = run(config, verifier=(model, tok), stream=io.StringIO())
    rej = [json.loads(l) for l in (tmp_path / "run/generate/rejects.jsonl").open()]
    # a random 4-layer model never says <|im_end|> within 4 tokens: every sample is truncated
    assert [r["reason"] for r in rej] == ["truncated"] * 3
    for r, q in zip(rej, ("a?", "b?", "c?")):
        turn = r["turns"][0]
        want = greedy_reference(model, tok, [{"role": "user", "content": q}], 4)
        assert turn["completion_token_ids"] == want and turn["finish_reason"] == "length"
    assert m["counts"]["rejected"] == {"truncated": 3} and m["counts"]["samples"] == 0
    assert m["summary"]["completion_tokens"] == 12


def test_summary_figures_recount_from_the_written_samples(tiny, tmp_path):
    """Every figure of the end-of-run summary (issue #24, Deliver 3) recounted from
    samples.jsonl: total / response tokens, means, unique ids, reasoning %, skipped by reason."""
    model, tok = tiny
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question": q}) + "\n" for q in ("a?", "b?", "a?")))
    out = io.StringIO()
    config = GenerateConfig(prompts=str(prompts), run_dir=str(tmp_path / "run"), max_tokens=4,
                            batch_size=2, verifier="tiny", keep_truncated=True)
    s = run(config, verifier=(model, tok), stream=out)["summary"]
    recs = [json.loads(l) for l in (tmp_path / "run/generate/samples.jsonl").open()]
    turns = [r["turns"][0] for r in recs]
    seq = [len(t["prompt_token_ids"]) + len(t["completion_token_ids"]) for t in turns]
    ids = set().union(*(set(t["prompt_token_ids"]) | set(t["completion_token_ids"])
                        for t in turns))
    assert len(recs) == 2 and s["rejected"] == {"duplicate": 1}  # the repeated "a?"
    assert s["generated"] == s["tokenized"] == 2
    assert s["total_tokens"] == sum(seq) and s["response_tokens"] == 8
    assert s["mean_seq_len"] == round(sum(seq) / 2, 1) and s["mean_response_len"] == 4.0
    assert s["unique_tokens"] == len(ids) and s["with_reasoning_pct"] == 0.0
    # the rates use the progress clock, elapsed_s the stage clock: a few ms apart under load
    assert s["tokens_per_s"] == pytest.approx(8 / s["elapsed_s"], rel=5e-2)
    assert s["req_per_s"] == pytest.approx(2 / s["elapsed_s"], rel=5e-2)
    assert f"tokens: {sum(seq)} total, 8 response" in out.getvalue()
    assert "skipped: 1 (duplicate=1)" in out.getvalue()


def test_think_markers_are_one_setting():
    """``think_tokens`` is the one setting (``--think-tokens A,B``); settings files written with
    ``think_open``/``think_close`` still load as it; one of them alone is refused."""
    from specdraft.core.errors import ConfigError

    base = {"prompts": "p.jsonl", "run_dir": "r"}
    assert GenerateConfig(**base).think == ("<think>", "</think>")
    assert GenerateConfig.build({**base, "think_tokens": "<t>,</t>"}).think == ("<t>", "</t>")
    old = GenerateConfig.build({**base, "think_open": "<t>", "think_close": "</t>"})
    assert old.think_tokens == ("<t>", "</t>")
    with pytest.raises(ConfigError, match="give both, or think_tokens"):
        GenerateConfig.build({**base, "think_open": "<t>"})
