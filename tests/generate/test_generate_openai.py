"""The openai backend against real loopback HTTP servers (stdlib asyncio, vLLM response shape):
fault injection and retries, permanent errors and their retry on resume, rejects, multi-turn
history, load spreading and the API key."""

import asyncio
import hashlib
import io
import json
from collections import Counter

import pytest

from specdraft.core.errors import StageDirError
from specdraft.generate.config import GenerateConfig
from specdraft.generate.fakeserver import LoopbackServer, Reply, last_user, vllm_reply
from specdraft.generate.run import run

FAULTS = ("http_5xx", "http_429", "timeout", "malformed", "connection")


def write_prompts(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def read_jsonl(path):
    return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []


def cfg(tmp_path, url, prompts, **kw):
    base = dict(prompts=prompts, run_dir=str(tmp_path / "run"), backend="openai",
                endpoint=[url] if isinstance(url, str) else url, max_tokens=32,
                backoff_base_s=0.01, backoff_max_s=0.05, progress_interval_s=60)
    return GenerateConfig(**{**base, **kw})


def fault_of(user, attempt):
    """Deterministic ~10% fault per (prompt, attempt): which kind, or None."""
    h = int(hashlib.sha256(f"{user}:{attempt}".encode()).hexdigest(), 16)
    return FAULTS[(h // 10) % len(FAULTS)] if h % 10 == 0 else None


class FaultyHandler:
    def __init__(self):
        self.attempts = Counter()
        self.injected = Counter()
        self.per_prompt = Counter()

    async def __call__(self, body):
        user = last_user(body)
        kind = fault_of(user, self.attempts[user])
        self.attempts[user] += 1
        if kind is None:
            return vllm_reply(body, reasoning=f"thinking about {user}")
        self.injected[kind] += 1
        self.per_prompt[user] += 1
        if kind == "timeout":
            await asyncio.sleep(5)
            return vllm_reply(body)
        return {"http_5xx": Reply(503, {"error": "overloaded"}),
                "http_429": Reply(429, {"error": "slow down"}),
                "malformed": Reply(200, b'{"choices": [{"message": '),
                "connection": Reply(drop=True)}[kind]


def test_faults_200_prompts_each_once_and_error_counts_right(tmp_path):
    handler = FaultyHandler()
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"question {i}"}
                                                   for i in range(200)])
    with LoopbackServer(handler) as url:
        m = run(cfg(tmp_path, url, prompts, concurrency=32, timeout_s=1.5, max_retries=10),
                stream=io.StringIO())
    samples = read_jsonl(tmp_path / "run/generate/samples.jsonl")
    assert sorted(r["id"] for r in samples) == sorted(f"q{i}" for i in range(200))
    assert read_jsonl(tmp_path / "run/generate/rejects.jsonl") == []
    assert sum(handler.injected.values()) >= 10  # ~10% of 200+ attempts, all five kinds
    assert set(handler.injected) == set(FAULTS)
    assert m["retries"] == dict(sorted(handler.injected.items()))
    assert m["failed_requests"] == {}
    for r in samples:  # attempts recorded per sample = 1 + faults injected for its prompt
        user = r["messages"][0]["content"]
        assert r["turns"][0]["attempts"] == 1 + handler.per_prompt[user]
        assert r["messages"][1] == {"role": "assistant", "content": f"Answer to: {user}",
                                    "reasoning": f"thinking about {user}"}
        assert r["turns"][0]["reasoning_source"] == "reasoning"
    assert m["counts"]["samples"] == 200 and m["counts"]["rejected"] == {}
    assert m["summary"]["generated"] == 200 and m["summary"]["with_reasoning_pct"] == 100.0


def test_permanent_error_is_rejected_then_retried_on_resume(tmp_path):
    healthy = {"on": False}

    async def handler(body):
        if last_user(body) == "bad" and not healthy["on"]:
            return Reply(500, {"error": "boom"})
        if last_user(body) == "invalid":
            return Reply(400, {"error": "context too long"})
        return vllm_reply(body)

    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": i, "prompt": i}
                                                   for i in ("good", "bad", "invalid")])
    with LoopbackServer(handler) as url:
        m = run(cfg(tmp_path, url, prompts, max_retries=2), stream=io.StringIO())
        rej = {r["id"]: r for r in read_jsonl(tmp_path / "run/generate/rejects.jsonl")}
        assert {k: r["reason"] for k, r in rej.items()} == {"bad": "error", "invalid": "error"}
        assert "http_5xx" in rej["bad"]["detail"] and "after 3 attempts" in rej["bad"]["detail"]
        assert "HTTP 400" in rej["invalid"]["detail"] and "after 1 attempts" in \
            rej["invalid"]["detail"]
        assert m["retries"] == {"http_5xx": 3} and m["failed_requests"] == {
            "http_400": 1, "http_5xx": 1}
        assert m["counts"]["rejected"] == {"error": 2}
        healthy["on"] = True
        with pytest.raises(StageDirError, match="--resume"):
            run(cfg(tmp_path, url, prompts), stream=io.StringIO())
        m2 = run(cfg(tmp_path, url, prompts, resume=True), stream=io.StringIO())
    assert [r["id"] for r in read_jsonl(tmp_path / "run/generate/samples.jsonl")] == ["good",
                                                                                      "bad"]
    assert [(r["id"], r["reason"]) for r in read_jsonl(tmp_path / "run/generate/rejects.jsonl")
            ] == [("invalid", "error")]
    assert m2["counts"]["retried_errors"] == 2 and m2["counts"]["already_done"] == 1
    assert m2["counts"]["samples"] == 2 and m2["counts"]["rejected"] == {"error": 1}


def test_model_caused_rejects_are_kept_on_resume(tmp_path):
    async def handler(body):
        u = last_user(body)
        if u == "trunc":
            return vllm_reply(body, content="partial", finish_reason="length")
        if u == "empty":
            return vllm_reply(body, content="<think>only thoughts</think>")
        if u == "twice":
            return vllm_reply(body, content="a</think>b</think>c")
        if u == "noreason":
            return vllm_reply(body, content="plain")
        return vllm_reply(body, reasoning="r")

    names = ["ok", "trunc", "empty", "twice", "noreason", "ok"]
    prompts = write_prompts(tmp_path / "p.jsonl", [{"prompt": n} for n in names])
    seen = Counter()

    async def counting(body):
        seen[last_user(body)] += 1
        return await handler(body)

    with LoopbackServer(counting) as url:
        m = run(cfg(tmp_path, url, prompts, require_reasoning=True), stream=io.StringIO())
        m2 = run(cfg(tmp_path, url, prompts, require_reasoning=True, resume=True),
                 stream=io.StringIO())
    want = {"duplicate": 1, "empty_answer": 1, "empty_reasoning": 1, "malformed_think": 1,
            "truncated": 1}
    assert m["counts"]["rejected"] == want and m["counts"]["samples"] == 1
    assert m2["counts"]["rejected"] == want and m2["counts"]["finished_this_run"] == 0
    assert seen == Counter({n: 1 for n in set(names)})  # nothing regenerated on resume
    rej = read_jsonl(tmp_path / "run/generate/rejects.jsonl")
    assert len(rej) == 5  # the duplicate line is not written twice
    dup = next(r for r in rej if r["reason"] == "duplicate")
    assert dup["source"].endswith("p.jsonl:6")
    trunc = next(r for r in rej if r["reason"] == "truncated")
    assert trunc["messages"][-1]["content"] == "partial"


def test_multi_turn_history_carries_own_answer(tmp_path, shared_data):
    rows = [json.loads(l) for l in (shared_data / "mt_bench/question.jsonl").open()][:2]
    requests = []

    async def handler(body):
        requests.append(body["messages"])
        return vllm_reply(body, content=f"<think>plan {len(body['messages'])}</think>"
                                        f"ans {len(body['messages'])}")

    prompts = write_prompts(tmp_path / "mt.jsonl", rows)
    with LoopbackServer(handler) as url:
        m = run(cfg(tmp_path, url, prompts, concurrency=1,
                    chat_template_kwargs={"enable_thinking": True}), stream=io.StringIO())
    t1, t2 = rows[0]["turns"]
    # the earlier answer goes back with its reasoning (vLLM reads `reasoning`, SGLang and
    # llama.cpp `reasoning_content`), so the server's template sees what prepare renders
    assert requests[:2] == [[{"role": "user", "content": t1}],
                            [{"role": "user", "content": t1},
                             {"role": "assistant", "content": "ans 1", "reasoning": "plan 1",
                              "reasoning_content": "plan 1"},
                             {"role": "user", "content": t2}]]
    rec = read_jsonl(tmp_path / "run/generate/samples.jsonl")[0]
    assert rec["id"] == str(rows[0]["question_id"])
    assert rec["messages"] == [
        {"role": "user", "content": t1},
        {"role": "assistant", "content": "ans 1", "reasoning": "plan 1"},
        {"role": "user", "content": t2},
        {"role": "assistant", "content": "ans 3", "reasoning": "plan 3"}]
    assert [t["message_index"] for t in rec["turns"]] == [1, 3]
    assert [t["reasoning_source"] for t in rec["turns"]] == ["inline", "inline"]
    assert rec["chat_template_kwargs"] == {"enable_thinking": True}
    assert rec["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 32}
    assert rec["model"] == "loopback-model" and rec["backend"] == "openai"
    # the fake emits one id per whitespace word of "<think>plan 1</think>ans 1" (3) + a stop id
    assert rec["turns"][0]["completion_token_ids"] == [1, 2, 3, 4]
    assert m["counts"]["samples"] == 2


def test_request_body_passthrough_and_token_ids(tmp_path):
    bodies = []

    async def handler(body):
        bodies.append(body)
        return vllm_reply(body, content="a b", token_ids=[7, 8, 2])

    prompts = write_prompts(tmp_path / "p.jsonl", [{"prompt": "x"}])
    with LoopbackServer(handler) as url:
        run(cfg(tmp_path, url, prompts, model="m1", seed=3, extra_body={"top_k": 5},
                chat_template_kwargs={"enable_thinking": False}), stream=io.StringIO())
    assert bodies[0] == {"model": "m1", "messages": [{"role": "user", "content": "x"}],
                         "temperature": 0.0, "top_p": 1.0, "max_tokens": 32, "seed": 3,
                         "stream": False, "chat_template_kwargs": {"enable_thinking": False},
                         "return_token_ids": True, "top_k": 5}
    turn = read_jsonl(tmp_path / "run/generate/samples.jsonl")[0]["turns"][0]
    assert turn["completion_token_ids"] == [7, 8, 2] and turn["prompt_token_ids"] == [100]


def test_load_spread_over_two_endpoints_and_api_key(tmp_path, monkeypatch):
    async def slow(body):
        await asyncio.sleep(0.02)
        return vllm_reply(body)

    monkeypatch.setenv("SPECDRAFT_TEST_KEY", "sk-secret-123")
    prompts = write_prompts(tmp_path / "p.jsonl", [{"prompt": f"p{i}"} for i in range(40)])
    a, b = LoopbackServer(slow), LoopbackServer(slow)
    with a as url_a, b as url_b:
        m = run(cfg(tmp_path, [url_a, url_b], prompts, concurrency=8,
                    api_key_env="SPECDRAFT_TEST_KEY"), stream=io.StringIO())
    per = Counter(r["endpoint"] for r in read_jsonl(tmp_path / "run/generate/samples.jsonl"))
    assert set(per) == {url_a, url_b} and min(per.values()) >= 12
    # /models (1) on the first endpoint, then the chat requests; every one authenticated
    assert set(a.authorizations) == set(b.authorizations) == {"Bearer sk-secret-123"}
    text = (tmp_path / "run/generate/samples.jsonl").read_text() + json.dumps(m.to_dict())
    assert "sk-secret-123" not in text
    assert m["config"]["api_key_env"] == "SPECDRAFT_TEST_KEY"


def test_missing_api_key_variable_is_a_config_error(tmp_path, monkeypatch):
    from specdraft.core.errors import ConfigError

    monkeypatch.delenv("NOPE_KEY", raising=False)
    prompts = write_prompts(tmp_path / "p.jsonl", [{"prompt": "x"}])
    with pytest.raises(ConfigError, match="--api-key-env NOPE_KEY"):
        run(cfg(tmp_path, "http://127.0.0.1:9", prompts, api_key_env="NOPE_KEY"))
