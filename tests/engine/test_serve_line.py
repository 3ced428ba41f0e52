"""The vLLM serve line ``specdraft run`` prints runs as printed (issue 40: ``vllm serve`` failed
on the CPU wheel, served bf16, and named a hub id): the line from ``RUN/run/summary.txt`` of the
engine tests' pipeline run (:func:`conftest.overfit_run`, shared with test_vllm.py) is run by
bash with only ``--host``/``--port`` (a free port), ``--enforce-eager`` and ``--max-model-len``
appended (start-up and memory on 2 CPU cores; none changes what is computed), and asked one
question: it answers with the tokens eval's engine committed for that prompt, and its
spec-decode counters show that the drafter proposed."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess

import httpx
import pytest

from engine_kit import MAX_TOKENS, QUESTIONS, wait_until_serving

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def printed_vllm_line(run_dir) -> str:
    """The one vLLM command line of the run summary (without its two-space indent)."""
    summary = (run_dir / "run" / "summary.txt").read_text(encoding="utf-8")
    lines = [ln.strip() for ln in summary.splitlines()
             if " -m vllm.entrypoints.openai.api_server " in ln]
    assert len(lines) == 1, summary
    return lines[0]


@pytest.fixture(scope="module")
def served(overfit_run, tmp_path_factory):
    """The printed line, started by bash on 127.0.0.1; its process group is stopped in a
    finally. Yields ``(url, line)``."""
    from specdraft.engines.process import stop as stop_engine

    line = printed_vllm_line(overfit_run)
    port = _free_port()
    log_path = tmp_path_factory.mktemp("serve_line") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": ""}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            ["bash", "-c", f"{line} --host 127.0.0.1 --port {port} --enforce-eager "
                           f"--max-model-len 1024"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, url, log_path)
        yield url, line
    finally:
        stop_engine(proc)


def _drafts(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in
               re.finditer(r"^vllm:spec_decode_num_drafts(?:_total)?(?:\{[^}]*\})? (\S+)$",
                           text, re.M))


def test_the_printed_line_serves_the_evaluated_figures(served, overfit_run, engine_verifier):
    url, line = served
    assert f"--model {engine_verifier.resolve()} --dtype float32 --speculative-config" in line
    assert line.split()[0].endswith("python") and "vllm serve" not in line
    results = json.loads((overfit_run / "eval" / "results.json").read_text())
    engine_q0 = next(p for p in results["engine"]["prompts"] if p["id"] == "q0")["tokens"]
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    before = _drafts(url)
    body = {"model": model, "messages": [{"role": "user", "content": QUESTIONS[0]}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
    res = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert res.status_code == 200, res.text
    choice = res.json()["choices"][0]
    tokens = choice["token_ids"]
    assert choice["message"]["content"] and tokens
    assert tokens == engine_q0[:len(tokens)]  # float32, as measured: the same greedy tokens
    assert _drafts(url) > before              # the drafter of --speculative-config proposed
