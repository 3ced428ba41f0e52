"""The real SmolLM2-135M-Instruct GGUF on 8 GSM8K prompts: through llama.cpp's
OpenAI-compatible server (started and stopped here) and through the local backend."""

import importlib.util
import io
import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from specdraft.generate.config import GenerateConfig
from specdraft.generate.run import run

pytestmark = pytest.mark.slow
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def gsm8k8(shared_data, tmp_path_factory):
    lines = (shared_data / "gsm8k/train.jsonl").read_text().splitlines()[:8]
    path = tmp_path_factory.mktemp("gsm8k") / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(smollm2_gguf, tmp_path_factory):
    """``python -m llama_cpp.server`` on 127.0.0.1 with the SmolLM2 GGUF; stopped afterwards."""
    if importlib.util.find_spec("llama_cpp") is None:
        from prerequisites import missing

        missing("llama-cpp-python[server] is not installed", "make install-server")
    port = _free_port()
    log = open(tmp_path_factory.mktemp("llama") / "server.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf), "--host",
         "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "2",
         "--model_alias", "smollm2", "--verbose", "False"], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"llama.cpp server exited: {log.read()[-2000:]}")
            try:
                if httpx.get(url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama.cpp server did not come up in 120 s"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _records(run_dir):
    read = lambda name: [json.loads(l) for l in (run_dir / "generate" / name).open()]
    return read("samples.jsonl"), read("rejects.jsonl")


def _check_counts(m, samples, rejects):
    assert len(samples) + len(rejects) == 8
    assert {r["reason"] for r in rejects} <= {"truncated"}
    assert m["counts"]["samples"] == len(samples)
    assert m["counts"]["rejected"] == ({"truncated": len(rejects)} if rejects else {})
    tokens = sum(t["usage"]["completion_tokens"] for r in samples + rejects for t in r["turns"])
    assert m["summary"]["completion_tokens"] == tokens
    assert m["summary"]["generated"] == len(samples)
    for r in rejects:
        assert r["turns"][0]["usage"]["completion_tokens"] == MAX_TOKENS
    for r in samples:
        turn = r["turns"][0]
        assert turn["finish_reason"] == "stop"
        assert 0 < turn["usage"]["completion_tokens"] <= MAX_TOKENS
        assert r["messages"][1]["content"] and r["messages"][1]["reasoning"] is None
        assert turn["reasoning_source"] == "none"


@pytest.mark.server
def test_llama_cpp_server(llama_server, gsm8k8, tmp_path):
    config = GenerateConfig(prompts=str(gsm8k8), run_dir=str(tmp_path / "run"), backend="openai",
                            endpoint=[llama_server], concurrency=4, max_tokens=MAX_TOKENS,
                            timeout_s=300)
    log = io.StringIO()
    m = run(config, stream=log)
    samples, rejects = _records(tmp_path / "run")
    _check_counts(m, samples, rejects)
    questions = [json.loads(l)["question"] for l in gsm8k8.open()]
    assert sorted(r["messages"][0]["content"] for r in samples + rejects) == sorted(questions)
    for r in samples:
        assert (r["model"], r["endpoint"], r["backend"]) == ("smollm2", llama_server, "openai")
        assert r["turns"][0]["completion_token_ids"] is None  # llama.cpp does not return them
    assert m["retries"] == {} and m["model"] == "smollm2"
    assert f"generated: {len(samples)}" in log.getvalue()


def test_local_backend_smollm2(smollm2_gguf, gsm8k8, tmp_path):
    from specdraft.generate.local_backend import LocalBackend

    backend = LocalBackend.load(str(smollm2_gguf), max_tokens=MAX_TOKENS)
    config = GenerateConfig(prompts=str(gsm8k8), run_dir=str(tmp_path / "run"),
                            verifier=str(smollm2_gguf), batch_size=8, max_tokens=MAX_TOKENS)
    m = run(config, verifier=backend, stream=io.StringIO())
    samples, rejects = _records(tmp_path / "run")
    _check_counts(m, samples, rejects)
    tok, eos = backend.tokenizer, backend.tokenizer.eos_token_id
    for r in samples:
        ids = r["turns"][0]["completion_token_ids"]
        assert ids[-1] == eos and eos not in ids[:-1]
        assert r["messages"][1]["content"] == tok.decode(ids[:-1]).strip()
    # Independent reference: the first prompt alone (no padding) through HF generate, greedy.
    first = (samples + rejects)[0]
    ref = backend.model.generate(
        **tok(backend.render(first["messages"][:1]), return_tensors="pt",
              add_special_tokens=False), max_new_tokens=12, do_sample=False)
    n_prompt = len(first["turns"][0]["prompt_token_ids"])
    assert first["turns"][0]["completion_token_ids"][:12] == ref[0, n_prompt:].tolist()[:12]
