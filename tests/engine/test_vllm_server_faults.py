"""``specdraft generate --backend openai`` (the CLI, a subprocess) against a real ``vllm serve``
on 127.0.0.1 at concurrency 64, beside an endpoint that answers only HTTP 500 / 429 / broken
JSON; the vLLM server's process group is SIGKILLed mid-run and started again on the same port.

Every prompt is answered exactly once (no id lost, none twice), by vLLM only; the one prompt
longer than the server's context is the one reject, explained by vLLM's HTTP 400; the manifest's
retries are exactly the failing endpoint's replies (by kind) plus the connections vLLM's death
broke. The scenario is :func:`bench_generate_server.run_under_faults`, which also prints the
req/s and tok/s figures of docs/generate-under-load.md. Time bounds are hang bounds only."""

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_generate_server import (VllmServer, build_tiny_verifier,  # noqa: E402
                                   run_under_faults)


pytestmark = pytest.mark.slow
PROMPTS, CONCURRENCY, MAX_TOKENS, KILL_AFTER = 192, 64, 16, 96


@pytest.fixture(scope="module")
def faulted(vllm_python, tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm_faults")
    server = VllmServer(vllm_python, build_tiny_verifier(work / "model"), work / "vllm.log")
    try:
        server.start()
        yield run_under_faults(server, work, prompts=PROMPTS, concurrency=CONCURRENCY,
                               max_tokens=MAX_TOKENS, kill_after=KILL_AFTER)
    finally:
        server.kill()


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_prompt_answered_exactly_once_by_vllm(faulted):
    out = faulted["run_dir"] / "generate"
    samples, rejects = _read(out / "samples.jsonl"), _read(out / "rejects.jsonl")
    ids = [r["id"] for r in samples]
    assert len(ids) == len(set(ids)), Counter(ids).most_common(3)  # none twice
    assert sorted(ids + [r["id"] for r in rejects]) == sorted(faulted["ids"])  # none lost
    assert faulted["killed_at_samples"] < PROMPTS  # the kill came mid-run
    vllm_url = faulted["manifest"]["endpoints"][0].removesuffix("/chat/completions")
    for r in samples:
        turn = r["turns"][0]
        assert r["endpoint"] == turn["endpoint"] == vllm_url  # never the failing endpoint
        assert turn["prompt_token_ids"] and turn["completion_token_ids"]
        assert len(turn["completion_token_ids"]) == turn["usage"]["completion_tokens"]
        assert 1 <= len(turn["completion_token_ids"]) <= MAX_TOKENS
    assert max(r["turns"][0]["attempts"] for r in samples) > 1  # some rode out the restart


def test_the_reject_is_explained(faulted):
    # refused before it was sent: the server's context from /v1/models (max_model_len 512),
    # the prompt's length from its /tokenize (generate/screen.py), never an HTTP 400
    rejects = _read(faulted["run_dir"] / "generate" / "rejects.jsonl")
    assert [(r["id"], r["reason"]) for r in rejects] == [("too_long", "too_long")]
    detail = rejects[0]["detail"]
    assert "the verifier's context is 512" in detail, detail


def test_manifest_counts_add_up(faulted):
    m, bad = faulted["manifest"], faulted["bad_sent"]
    samples = _read(faulted["run_dir"] / "generate" / "samples.jsonl")
    c = m["counts"]
    assert (c["selected"], c["samples"], c["rejected"]) == (PROMPTS + 1, PROMPTS,
                                                           {"too_long": 1})
    assert c["finished_this_run"] in (PROMPTS, PROMPTS + 1)
    assert m["failed_requests"] == {}  # the over-long prompt never reached the server
    # each reply of the failing endpoint is one retry of its kind, charged to that endpoint
    assert set(bad) == {"http_5xx", "http_429", "malformed"}
    assert {k: m["retries"][k] for k in bad} == bad
    assert m["retries_by_endpoint"][faulted["bad_url"]] == sum(bad.values())
    # the rest are the requests vLLM's death broke or refused, charged to vLLM
    on_vllm = sum(v for k, v in m["retries"].items() if k not in bad)
    assert m["retries"]["connection"] >= 1 and set(m["retries"]) - set(bad) <= {"connection",
                                                                                 "timeout"}
    vllm_url = m["endpoints"][0].removesuffix("/chat/completions")
    assert m["retries_by_endpoint"][vllm_url] == on_vllm
    assert sum(r["turns"][0]["attempts"] - 1 for r in samples) <= sum(m["retries"].values())
    tokens = sum(r["turns"][0]["usage"]["completion_tokens"] for r in samples)
    assert m["summary"]["completion_tokens"] == tokens


def test_the_load_reached_the_server(faulted):
    """generate posted many requests to vLLM at once (the manifest's peak_in_flight: sent, not
    yet answered). Not all 64: the rest were at the failing endpoint or waiting out a retry
    delay. vLLM's own running/waiting gauges are no witness here: its API server answers
    /metrics only between bursts, and the tiny model answers a burst of 64 within one (the
    LoadGauge of bench_generate_server.py read 0 on a quiet machine, 31 to 42 on a busy one)."""
    m = faulted["manifest"]
    vllm_url = m["endpoints"][0].removesuffix("/chat/completions")
    assert m["peak_in_flight"][vllm_url] >= CONCURRENCY // 2, m["peak_in_flight"]
    assert max(m["peak_in_flight"].values()) <= CONCURRENCY
