"""Over-long prompts are rejected as ``too_long`` before they reach the verifier, in both
backends: the server's context from ``/v1/models`` ``max_model_len`` (else the ``--verifier``
config), its tokens from the server's ``/tokenize`` (else the ``--verifier`` tokenizer); the
local verifier's ``max_position_embeddings`` and tokenizer."""

from __future__ import annotations

import io
import json

import pytest
import torch

from specdraft.generate.config import GenerateConfig
from specdraft.generate.fakeserver import LoopbackServer
from specdraft.generate.run import run

LONG = " ".join(f"w{i}" for i in range(30))       # 30 loopback "tokens" (words)
SHORT = "Hi there"                                  # 2
HALF = " ".join(f"h{i}" for i in range(12))        # 12: fits alone, not twice


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _config(tmp_path, server, **kw):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "long", "prompt": LONG}, {"id": "short", "prompt": SHORT},
        {"id": "two_halves", "turns": [HALF, HALF.replace("h", "k")]}]))
    return GenerateConfig(prompts=str(prompts), run_dir=str(tmp_path / "run"),
                          backend="openai", endpoint=[server.url], max_tokens=8,
                          max_reject_fraction=1.0, **kw)


def _prompt_tokens(tok, text):
    """Tokens of ``text``'s one-turn prompt: the template by hand, as a server renders it."""
    rendered = tok.apply_chat_template([{"role": "user", "content": text}],
                                       add_generation_prompt=True, tokenize=False)
    return len(tok(rendered, add_special_tokens=False)["input_ids"])


def _sent_texts(server):
    return [m["content"] for b in server.chat_bodies for m in b["messages"]]


def test_server_context_and_tokenize_reject_before_any_request(tmp_path):
    server = LoopbackServer(max_model_len=20)
    server.start()
    try:
        m = run(_config(tmp_path, server), stream=io.StringIO())
    finally:
        server.stop()
    rejects = {r["id"]: r for r in _lines(tmp_path / "run/generate/rejects.jsonl")}
    assert sorted(rejects) == ["long", "two_halves"]
    assert rejects["long"]["reason"] == "too_long"
    assert "at least 30 tokens, the verifier's context is 20" in rejects["long"]["detail"]
    # MT-bench: each turn fits alone (12), the last turn's prompt cannot (12 + 12 >= 20)
    assert "at least 24 tokens" in rejects["two_halves"]["detail"]
    assert rejects["long"]["source"].endswith("p.jsonl:1")
    assert [s["id"] for s in _lines(tmp_path / "run/generate/samples.jsonl")] == ["short"]
    sent = _sent_texts(server)
    assert SHORT in sent and LONG not in sent and HALF not in sent
    assert len(server.chat_bodies) == 1
    assert m["length_check"] == {"context_tokens": 20,
                                 "context_from": "server /v1/models max_model_len",
                                 "counted_by": "server /tokenize", "too_long": 2}
    assert m["counts"]["rejected"] == {"too_long": 2}


def test_without_tokenize_the_verifier_tokenizer_counts(tmp_path, tiny_verifier_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_verifier_dir)
    short_len, long_len = (_prompt_tokens(tok, text) for text in (SHORT, LONG))
    context = short_len + 5
    assert long_len >= context  # the long prompt cannot fit, the short one does
    server = LoopbackServer(max_model_len=context, tokenize=False)
    server.start()
    try:
        m = run(_config(tmp_path, server, verifier=str(tiny_verifier_dir)), stream=io.StringIO())
    finally:
        server.stop()
    rejects = {r["id"]: r for r in _lines(tmp_path / "run/generate/rejects.jsonl")}
    assert rejects["long"]["reason"] == "too_long"
    assert f"at least {long_len} tokens, the verifier's context is {context}" in \
        rejects["long"]["detail"]
    assert LONG not in _sent_texts(server) and SHORT in _sent_texts(server)
    assert m["length_check"]["counted_by"] == "--verifier tokenizer"


def test_without_max_model_len_the_verifier_config_gives_the_context(tmp_path,
                                                                       tiny_verifier_dir):
    # the tiny verifier's max_position_embeddings is 2048; the loopback counts words
    huge = " ".join(["w"] * 2048)
    server = LoopbackServer()
    server.start()
    try:
        cfg = _config(tmp_path, server, verifier=str(tiny_verifier_dir))
        (tmp_path / "p.jsonl").write_text(json.dumps({"id": "huge", "prompt": huge}) + "\n" +
                                          json.dumps({"id": "short", "prompt": SHORT}) + "\n")
        m = run(cfg, stream=io.StringIO())
    finally:
        server.stop()
    (rej,) = _lines(tmp_path / "run/generate/rejects.jsonl")
    assert (rej["id"], rej["reason"]) == ("huge", "too_long")
    assert "at least 2048 tokens, the verifier's context is 2048" in rej["detail"]
    assert len(server.chat_bodies) == 1
    assert m["length_check"]["context_from"] == "--verifier config"


def test_nothing_to_measure_with_is_said_not_guessed(tmp_path):
    server = LoopbackServer()
    server.start()
    err = io.StringIO()
    try:
        m = run(_config(tmp_path, server), stream=err)
    finally:
        server.stop()
    assert "context length is unknown" in err.getvalue()
    assert m["length_check"] == {"context_tokens": None, "too_long": 0}
    assert LONG in _sent_texts(server)


@pytest.fixture
def short_context(tiny_verifier_dir):
    """The tiny verifier with a 48-token context, its tokenizer, and every conversation its
    backend was asked to generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdraft.generate.local_backend import LocalBackend

    model = AutoModelForCausalLM.from_pretrained(tiny_verifier_dir, dtype=torch.float32).eval()
    model.config.max_position_embeddings = 48
    tok = AutoTokenizer.from_pretrained(tiny_verifier_dir)
    backend = LocalBackend(model, tok, max_tokens=3, name="tiny")
    seen = []
    generate = backend.generate

    def recording(convs, tools=None):
        seen.extend(convs)
        return generate(convs, tools)

    backend.generate = recording
    return backend, tok, seen


def test_local_backend_rejects_before_generating(tmp_path, short_context):
    backend, tok, seen = short_context
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "long", "prompt": LONG}) + "\n" +
                       json.dumps({"id": "short", "prompt": SHORT}) + "\n")
    long_len = _prompt_tokens(tok, LONG)
    assert long_len >= 48
    config = GenerateConfig(prompts=str(prompts), run_dir=str(tmp_path / "run"), max_tokens=3,
                            verifier="tiny", max_reject_fraction=1.0, keep_truncated=True)
    m = run(config, verifier=backend, stream=io.StringIO())
    (rej,) = _lines(tmp_path / "run/generate/rejects.jsonl")
    assert (rej["id"], rej["reason"]) == ("long", "too_long")
    assert f"at least {long_len} tokens, the verifier's context is 48" in rej["detail"]
    assert [c[-1]["content"] for c in seen] == [SHORT]
    assert [s["id"] for s in _lines(tmp_path / "run/generate/samples.jsonl")] == ["short"]
    assert m["length_check"]["context_from"] == "verifier max_position_embeddings"


def test_too_long_counts_toward_the_reject_fraction(tmp_path):
    server = LoopbackServer(max_model_len=20)
    server.start()
    try:
        cfg = _config(tmp_path, server).model_copy(update={"max_reject_fraction": 0.5})
        with pytest.raises(Exception, match=r"2 of 3 input rows rejected \(67%.*'too_long': 2"):
            run(cfg, stream=io.StringIO())
    finally:
        server.stop()
    assert server.chat_bodies == []
