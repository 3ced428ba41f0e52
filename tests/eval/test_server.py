"""`eval --server`: counters read before/after from a fake vLLM, server info from a fake SGLang."""

import httpx
import pytest

from specdraft.eval.server import server_eval

BEFORE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 2.0
"""
# +4 drafts (12 draft tokens), +6 accepted: positions +3, +2, +1
AFTER = BEFORE.replace("} 10.0", "} 14.0").replace("} 30.0", "} 42.0").replace(
    "} 15.0", "} 21.0").replace('"0"} 8.0', '"0"} 11.0').replace('"1"} 5.0', '"1"} 7.0').replace(
    '"2"} 2.0', '"2"} 3.0')


def client(handler):
    return httpx.Client(base_url="http://fake", transport=httpx.MockTransport(handler))


def fake_vllm():
    state = {"calls": 0}

    def handler(req):
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if req.url.path == "/v1/chat/completions":
            state["calls"] += 1
            return httpx.Response(200, json={"usage": {"completion_tokens": 5}})
        if req.url.path == "/metrics":
            return httpx.Response(200, text=AFTER if state["calls"] else BEFORE)
        return httpx.Response(404)
    return handler


def test_vllm_counters_differenced():
    prompts = [{"id": "a", "messages": [{"role": "user", "content": "x"}]}] * 2
    r = server_eval("http://fake", prompts, max_tokens=8, temperature=0.0,
                    client=client(fake_vllm()))
    assert r["engine"] == "vllm" and r["tau"] == pytest.approx(1 + 6 / 4)
    assert r["per_position"] == pytest.approx([3 / 4, 2 / 4, 1 / 4])
    assert r["acceptance_rate"] == pytest.approx(6 / 12) and r["new_tokens"] == 10


def test_sglang_server_info():
    def handler(req):
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if req.url.path == "/v1/chat/completions":
            return httpx.Response(200, json={"usage": {"completion_tokens": 3}})
        if req.url.path == "/get_server_info":
            return httpx.Response(200, json={"internal_states": [{"avg_spec_accept_length": 2.7}]})
        return httpx.Response(404)
    r = server_eval("http://fake", [{"id": "a", "messages": []}], max_tokens=8,
                    temperature=0.0, client=client(handler))
    assert r["engine"] == "sglang" and r["tau"] == 2.7
