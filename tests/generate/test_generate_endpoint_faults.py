"""The openai backend with one endpoint that only ever fails and one that goes away and comes
back (loopback servers, vLLM response shape), at concurrency 64: every prompt answered exactly
once, the failed attempts counted by kind and by endpoint.

The real-server version (vLLM killed with SIGKILL and restarted) is
``tests/engine/test_vllm_server_faults.py``."""

import asyncio
import io
import itertools
import json
import threading
import time
from collections import Counter

import pytest

from specdraft.generate.config import GenerateConfig
from specdraft.generate.fakeserver import LoopbackServer, Reply, last_user, vllm_reply
from specdraft.generate.run import run

#: What the failing endpoint answers, in turn: HTTP 500, HTTP 429, a 200 that is not JSON.
BAD_REPLIES = (("http_5xx", Reply(500, {"error": "boom"})),
               ("http_429", Reply(429, {"error": "slow down"})),
               ("malformed", Reply(200, b'{"choices": [{"mess')))


class FailingHandler:
    """Answers every request with the next of :data:`BAD_REPLIES`; counts them by kind."""

    def __init__(self):
        self.turn = itertools.count()
        self.sent = Counter()

    async def __call__(self, body):
        kind, reply = BAD_REPLIES[next(self.turn) % len(BAD_REPLIES)]
        self.sent[kind] += 1
        return reply


class CountingHandler:
    """A slowish healthy server (``delay_s`` per request); counts prompts answered."""

    def __init__(self, delay_s=0.02):
        self.delay_s = delay_s
        self.answered = Counter()

    async def __call__(self, body):
        await asyncio.sleep(self.delay_s)
        self.answered[last_user(body)] += 1
        return vllm_reply(body)


def _prompts(tmp_path, n):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"p{i}"}) + "\n"
                            for i in range(n)))
    return str(path)


def _settings(tmp_path, prompts, endpoints, **kw):
    return GenerateConfig(**{**dict(prompts=prompts, run_dir=str(tmp_path / "run"),
                                    backend="openai", endpoint=endpoints, concurrency=64,
                                    max_tokens=16, max_retries=5, backoff_base_s=0.05,
                                    backoff_max_s=0.5, progress_interval_s=60), **kw})


def _ids(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_failing_endpoint_is_routed_around(tmp_path):
    """Planted fault: with the pick "fewest in flight" alone (no cooldown, no avoid), the
    failing endpoint (never anything in flight) drew nearly every attempt and 29 of 300 prompts
    ended as ``error`` rejects after 6 attempts; here none may."""
    bad, good = FailingHandler(), CountingHandler()
    prompts = _prompts(tmp_path, 300)
    with LoopbackServer(bad) as bad_url, LoopbackServer(good) as good_url:
        m = run(_settings(tmp_path, prompts, [bad_url, good_url]), stream=io.StringIO())
    out = tmp_path / "run/generate"
    assert sorted(_ids(out / "samples.jsonl")) == sorted(f"q{i}" for i in range(300))
    assert (out / "rejects.jsonl").read_text() == ""
    assert all(n == 1 for n in good.answered.values()) and len(good.answered) == 300
    # every failed attempt is one the failing server sent, counted under its kind and endpoint
    assert m["retries"] == dict(sorted(bad.sent.items())) and set(bad.sent) == {
        "http_5xx", "http_429", "malformed"}
    assert m["retries_by_endpoint"] == {bad_url: sum(bad.sent.values())}
    assert m["failed_requests"] == {} and m["counts"]["rejected"] == {}
    assert m["model"] == "loopback-model"  # listed by the good endpoint: the first one fails


class BarrierHandler:
    """Holds every request until ``n`` are held at once (a hang bound of 60 s), counting the
    most it held: the server's own view of the load."""

    def __init__(self, n):
        self.n, self.held, self.peak = n, 0, 0
        self.full = asyncio.Event()

    async def __call__(self, body):
        self.held += 1
        self.peak = max(self.peak, self.held)
        if self.held >= self.n:
            self.full.set()
        try:
            await asyncio.wait_for(self.full.wait(), 60)
        finally:
            self.held -= 1
        return vllm_reply(body)


def test_peak_in_flight_is_the_load_the_server_held(tmp_path):
    """The manifest's peak_in_flight equals the most requests the server held at once: all 8 of
    --concurrency 8 (planted fault: counting before a pooled client is acquired, or never
    decrementing, reports more than the server saw)."""
    server = BarrierHandler(8)
    with LoopbackServer(server) as url:
        m = run(_settings(tmp_path, _prompts(tmp_path, 24), [url], concurrency=8),
                stream=io.StringIO())
    assert m["counts"]["samples"] == 24
    assert server.peak == 8 and m["peak_in_flight"] == {url: 8}


def test_model_listing_falls_through_to_a_live_endpoint(tmp_path):
    """The first endpoint refuses connections: the model name comes from the second."""
    prompts = _prompts(tmp_path, 3)
    with LoopbackServer(model_name="served-b") as url:
        m = run(_settings(tmp_path, prompts, ["http://127.0.0.1:9/v1", url]),
                stream=io.StringIO())
    assert m["model"] == "served-b" and m["counts"]["samples"] == 3


@pytest.mark.parametrize("with_bad", [False, True])
def test_server_gone_and_back_every_prompt_once(tmp_path, with_bad):
    """The healthy server stops (in-flight connections reset, new ones refused) after 60
    answers and comes back on the same port 1.5 s later; the retry budget (12 retries, delays
    capped at 0.5 s: about 5 s) covers the gap. Every prompt is answered exactly once, the
    resets and refusals are counted as ``connection`` retries, nothing is rejected."""
    good = CountingHandler(delay_s=0.05)
    bad = FailingHandler()
    prompts = _prompts(tmp_path, 200)
    server = LoopbackServer(good)
    url = server.start()
    restarted = {}

    def bounce():
        while sum(good.answered.values()) < 60:
            time.sleep(0.005)
        server.stop()
        time.sleep(1.5)
        restarted["server"] = LoopbackServer(good, port=server.port)
        restarted["server"].start()

    thread = threading.Thread(target=bounce)
    thread.start()
    try:
        with LoopbackServer(bad) as bad_url:
            endpoints = [url, bad_url] if with_bad else [url]
            m = run(_settings(tmp_path, prompts, endpoints, max_retries=12, model="m"),
                    stream=io.StringIO())
    finally:
        thread.join(timeout=30)
        restarted["server"].stop()
    out = tmp_path / "run/generate"
    assert sorted(_ids(out / "samples.jsonl")) == sorted(f"q{i}" for i in range(200))
    assert (out / "rejects.jsonl").read_text() == ""
    # a prompt whose connection was reset mid-request may have been answered by the old
    # server too; the output still holds it once (above), and nothing was lost
    assert set(good.answered) == {f"p{i}" for i in range(200)}
    assert m["retries"].get("connection", 0) >= 1 and m["failed_requests"] == {}
    assert m["retries_by_endpoint"].get(url, 0) == m["retries"]["connection"] + \
        m["retries"].get("timeout", 0)
    assert m["retries_by_endpoint"].get(bad_url, 0) == sum(bad.sent.values())


def test_outage_longer_than_the_retry_budget_then_resume(tmp_path):
    """The only server is gone for longer than the retry budget (2 retries, ~0.1 s): the
    prompts it could not answer are rejected with reason ``error`` naming the refused
    connection; ``--resume`` once it is back answers exactly those, and every id ends in
    samples.jsonl once."""
    good = CountingHandler(delay_s=0.01)
    prompts = _prompts(tmp_path, 120)
    server = LoopbackServer(good)
    server.start()

    async def stop_after_40(body):
        if sum(good.answered.values()) >= 40:
            return Reply(drop=True)
        return await good(body)

    server.handler = stop_after_40  # answers 40, then drops every connection
    settings = dict(max_retries=2, model="m", concurrency=16)
    m1 = run(_settings(tmp_path, prompts, [server.url], **settings), stream=io.StringIO())
    out = tmp_path / "run/generate"
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    done = _ids(out / "samples.jsonl")
    assert len(done) >= 40 and len(done) + len(rejects) == 120
    assert {r["reason"] for r in rejects} == {"error"}
    assert all("connection" in r["detail"] and "after 3 attempts" in r["detail"]
               for r in rejects)
    assert m1["counts"]["rejected"] == {"error": len(rejects)}
    assert m1["failed_requests"] == {"connection": len(rejects)}
    server.handler = good  # back
    answered_before = Counter(good.answered)
    try:
        m2 = run(_settings(tmp_path, prompts, [server.url], resume=True, **settings),
                 stream=io.StringIO())
    finally:
        server.stop()
    ids = _ids(out / "samples.jsonl")
    assert sorted(ids) == sorted(f"q{i}" for i in range(120))  # each once, none lost
    assert (out / "rejects.jsonl").read_text() == ""
    again = good.answered - answered_before
    assert sorted(again) == sorted(r["messages"][0]["content"] for r in rejects)  # only those
    assert m2["counts"]["retried_errors"] == len(rejects)
    assert m2["counts"]["already_done"] == len(done) and m2["counts"]["samples"] == 120


def test_backoff_after_thousands_of_failures_is_the_cap():
    """An endpoint that fails all day counts thousands of consecutive failures; 2**2000 is no
    float (it raised OverflowError before the exponent was clamped)."""
    import random

    from specdraft.generate.client import backoff_s

    rng = random.Random(0)
    waits = [backoff_s(n, 1.0, 60.0, rng) for n in (6, 64, 1100, 5000)]
    assert all(30.0 <= w <= 60.0 for w in waits), waits
    assert 0.25 <= backoff_s(1, 0.5, 60.0, rng) <= 1.0  # d = 0.5 * 2**1 = 1 s
