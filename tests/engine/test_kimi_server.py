"""The first stages of the Kimi-K2.5 job through the real engine: ``vllm serve`` on 127.0.0.1 with
Kimi's reasoning parser (``--reasoning-parser kimi_k2``) serving the Kimi-K2.5-shaped MLA + MoE
verifier (``tests/kimi_fixture.py``), ``specdraft generate --backend openai`` at concurrency 32
on 40 prompts with ``--require-reasoning``, then ``specdraft prepare``, whose rows must be
exactly the server's ``prompt_token_ids + completion_token_ids`` (prepare re-renders each prompt
with the verifier's chat template and checks it against the server's ids).

The verifier is random and would never write ``</think>`` itself: the server ends each reasoning
after ``THINK_BUDGET`` tokens (vLLM's ``thinking_token_budget`` request field, passed through
``--extra-body``; ``--reasoning-config`` names ``<think>``/``</think>``), then the model answers
until ``max_tokens`` (kept with ``keep_truncated``). The reasoning is what the server's parser put
in ``message.reasoning``.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kimi_fixture import make_kimi_verifier  # noqa: E402

pytestmark = pytest.mark.slow
N_PROMPTS, CONCURRENCY, MAX_TOKENS, THINK_BUDGET = 40, 32, 16, 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def kimi_verifier(tmp_path_factory, think_tokenizer_dir) -> Path:
    return make_kimi_verifier(tmp_path_factory.mktemp("kimi") / "verifier", think_tokenizer_dir)


@pytest.fixture(scope="module")
def kimi_server(vllm_python, kimi_verifier, tmp_path_factory):
    """vLLM's OpenAI server on 127.0.0.1, float32, eager, with the ``kimi_k2`` reasoning parser;
    its process group is stopped in a finally. Started as ``python -m
    vllm.entrypoints.openai.api_server`` (what ``vllm serve`` runs): the ``vllm`` console script
    of this source-built ``.venv-vllm`` stops at ``importlib.metadata.version("vllm")``."""
    from specdraft.engines.process import stop as stop_engine

    port = _free_port()
    log_path = tmp_path_factory.mktemp("kimi_server") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": "", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "2"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model",
             str(kimi_verifier), "--served-model-name", "kimi",
             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
             "--enforce-eager", "--max-model-len", "512", "--reasoning-parser", "kimi_k2",
             "--reasoning-config", json.dumps({"reasoning_start_str": "<think>",
                                               "reasoning_end_str": "</think>"}),
             "--max-num-seqs", str(CONCURRENCY),
             # float32 MLA on a CPU with AMX: vLLM's default there is bf16-only (engines/vllm_cpu.py)
             "--attention-backend", "CPU_MLA"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 500
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited: {log_path.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"vllm serve did not come up: {log_path}"
            time.sleep(1)
        yield url, log_path
    finally:
        stop_engine(proc)


@pytest.mark.timeout(1200)
def test_generate_with_reasoning_then_prepare_has_the_servers_ids(kimi_server, kimi_verifier,
                                                                  tmp_path):
    import datasets

    from specdraft.generate.config import GenerateConfig
    from specdraft.generate.run import run as generate
    from specdraft.prepare.config import PrepareConfig
    from specdraft.prepare.run import run as prepare

    from transformers import AutoTokenizer

    url, _ = kimi_server
    tok = AutoTokenizer.from_pretrained(kimi_verifier)
    start_think, end_think = tok.convert_tokens_to_ids(["<think>", "</think>"])
    newline = tok.encode("\n", add_special_tokens=False)[0]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i:02d}", "question": f"Question {i}: what "
                                           f"is {i} times {i + 3}?"}) + "\n"
                               for i in range(N_PROMPTS)))
    run_dir = tmp_path / "run"
    summary = io.StringIO()
    generate(GenerateConfig(prompts=str(prompts), run_dir=str(run_dir), backend="openai",
                            endpoint=[url], concurrency=CONCURRENCY, max_tokens=MAX_TOKENS,
                            keep_truncated=True, require_reasoning=True, timeout_s=600,
                            extra_body={"thinking_token_budget": THINK_BUDGET},
                            verifier=str(kimi_verifier)), stream=summary)
    samples = [json.loads(line) for line in (run_dir / "generate" / "samples.jsonl").open()]
    assert sorted(s["id"] for s in samples) == [f"q{i:02d}" for i in range(N_PROMPTS)]
    m = json.loads((run_dir / "generate" / "manifest.json").read_text())
    s = m["summary"]
    assert s["with_reasoning"] == N_PROMPTS and s["with_reasoning_pct"] == 100.0, s
    assert "with reasoning: 40 (100.0%)" in summary.getvalue()

    prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(kimi_verifier)))
    rows = {r["sample_id"]: r for r in datasets.load_from_disk(
        str(run_dir / "prepare" / "dataset"))}
    assert set(rows) == {x["id"] for x in samples}
    for x in samples:
        turn = x["turns"][0]
        p, c = turn["prompt_token_ids"], turn["completion_token_ids"]
        assert p and len(c) == MAX_TOKENS, "vLLM returns the token ids (return_token_ids)"
        end = c.index(end_think)  # the reasoning ends inside the completion, forced or not
        assert 0 < end <= THINK_BUDGET + 1 and turn["reasoning_source"] == "reasoning", x["id"]
        assert p[-2:] == [start_think, newline], x["id"]  # the prompt opens the reasoning
        row = rows[x["id"]]
        assert row["input_ids"] == p + c, x["id"]
        assert row["loss_mask"] == [0] * len(p) + [1] * len(c), x["id"]
