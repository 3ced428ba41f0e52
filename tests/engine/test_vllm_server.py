"""`specdraft generate --backend openai` against a real vLLM server (SmolLM2-135M-Instruct,
converted from the GGUF to HF once), then `specdraft prepare`: each dataset row is exactly the
server's ``prompt_token_ids + completion_token_ids``, supervised on the completion only. The
server runs with a tool parser (``--enable-auto-tool-choice --tool-call-parser hermes``), so a
conversation with tools, a kept tool call and its result is accepted, rendered by the server
with a Qwen3-style tool template sent with the request, and prepare's rows are still the
server's ids."""

from __future__ import annotations

import io
import shutil
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow
QUESTIONS = ["What is 2+2?", "Name a primary colour.", "Say hello in French."]
MAX_TOKENS = 48


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def smollm2_hf(tmp_path_factory):
    from specdraft.engines.verifier_dir import gguf_to_hf_dir

    root = tmp_path_factory.mktemp("smollm2")
    yield gguf_to_hf_dir("smollm2", root / "hf")
    shutil.rmtree(root, ignore_errors=True)  # 0.5 GB of floats, not kept to the session's end


@pytest.fixture(scope="module")
def vllm_server(vllm_python, smollm2_hf, tmp_path_factory):
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 (float32, eager); its
    process group is stopped in a finally."""
    from specdraft.engines.process import stop as stop_engine

    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm_server") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": ""}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_hf),
             "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port),
             "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
             "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
             "--trust-request-chat-template"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 400
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited: {log_path.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"vLLM did not come up: {log_path}"
            time.sleep(1)
        yield url
    finally:
        stop_engine(proc)


def test_generate_against_vllm_then_prepare_has_the_servers_ids(vllm_server, smollm2_hf,
                                                                tmp_path):
    import datasets

    from specdraft.generate.config import GenerateConfig
    from specdraft.generate.run import run as generate
    from specdraft.prepare.config import PrepareConfig
    from specdraft.prepare.run import run as prepare

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "question": q}) + "\n"
                               for i, q in enumerate(QUESTIONS)))
    run_dir = tmp_path / "run"
    generate(GenerateConfig(prompts=str(prompts), run_dir=str(run_dir), backend="openai",
                            endpoint=[vllm_server], concurrency=3, max_tokens=MAX_TOKENS,
                            keep_truncated=True, timeout_s=300, verifier=str(smollm2_hf)),
             stream=io.StringIO())
    samples = [json.loads(line) for line in (run_dir / "generate" / "samples.jsonl").open()]
    assert sorted(s["id"] for s in samples) == ["q0", "q1", "q2"]
    prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(smollm2_hf)))
    ds = datasets.load_from_disk(str(run_dir / "prepare" / "dataset"))
    rows = {r["sample_id"]: r for r in ds}
    assert set(rows) == {"q0", "q1", "q2"}
    stopped = 0
    for s in samples:
        turn = s["turns"][0]
        p, c = turn["prompt_token_ids"], turn["completion_token_ids"]
        assert p and c, "vLLM returns token ids (return_token_ids)"
        row = rows[s["id"]]
        assert row["input_ids"] == p + c, s["id"]
        assert row["loss_mask"] == [0] * len(p) + [1] * len(c), s["id"]
        stopped += turn["finish_reason"] == "stop"
    assert stopped >= 1  # at least one answer ends with the model's own stop token


def test_tool_conversation_against_vllm_rows_are_the_servers_ids(vllm_server, smollm2_hf,
                                                                tmp_path):
    """A row with ``tools``, ``tool_choice``, a data tool call and its result: vLLM accepts the
    requests (tools and the kept call in the history, rendered with the Qwen3-style template of
    tests/families sent as the request's ``chat_template``), and every prepare row is the
    server's ``prompt_token_ids + completion_token_ids``; the server's prompt holds the tool
    listing, the call as the template renders it and the result (SmolLM2 answers in text)."""
    import datasets
    from transformers import AutoTokenizer

    from specdraft.generate.config import GenerateConfig
    from specdraft.generate.run import run as generate
    from specdraft.prepare.config import PrepareConfig
    from specdraft.prepare.run import run as prepare

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "families"))
    from qwen3_template import QWEN3_TEMPLATE

    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Rain probability in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    row = {"id": "umbrella", "tools": [weather], "tool_choice": "auto", "messages": [
        {"role": "user", "content": "Should I bring an umbrella in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"rain": 0.9}'},
        {"role": "user", "content": "And in Rome?"}]}
    prompts, template = tmp_path / "p.jsonl", tmp_path / "qwen3.jinja"
    # tool_choice "required": vLLM forces a call (in the hermes syntax) and answers with
    # message.tool_calls (80 tokens: the forced JSON must close)
    forced = {"id": "forced", "tools": [weather], "tool_choice": "required",
              "messages": [{"role": "user", "content": "What is the weather in Rome?"}]}
    prompts.write_text(json.dumps(row) + "\n" + json.dumps(forced) + "\n")
    template.write_text(QWEN3_TEMPLATE)
    run_dir, kwargs = tmp_path / "run", {"enable_thinking": False}
    man = generate(GenerateConfig(prompts=str(prompts), run_dir=str(run_dir), backend="openai",
                                  endpoint=[vllm_server], max_tokens=80, keep_truncated=True,
                                  timeout_s=300, chat_template_kwargs=kwargs,
                                  extra_body={"chat_template": QWEN3_TEMPLATE}),
                   stream=io.StringIO())
    samples = {s["id"]: s for s in map(json.loads, (run_dir / "generate" / "samples.jsonl")
                                       .open())}
    sample, called = samples["umbrella"], samples["forced"]
    assert sample["kept_turns"] == [1] and man.summary["turns"]["kept"] == 1
    answer = called["messages"][-1]
    assert [c["function"]["name"] for c in answer.get("tool_calls", [])] == ["get_weather"], \
        answer
    assert called["turns"][0]["finish_reason"] == "tool_calls"
    assert man.summary["turns"]["tool_call_answers"] == 1
    manifest = prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(smollm2_hf),
                                     chat_template=str(template), chat_template_kwargs=kwargs))
    rows = {(r["sample_id"], r["turn_index"]): r
            for r in datasets.load_from_disk(str(run_dir / "prepare" / "dataset"))}
    turns = {**{("umbrella", i): t for i, t in enumerate(sample["turns"])},
             ("forced", 0): called["turns"][0]}
    assert sorted(rows) == sorted(turns)
    for key, turn in turns.items():
        row_, p, c = rows[key], turn["prompt_token_ids"], turn["completion_token_ids"]
        assert row_["input_ids"] == p + c and row_["loss_mask"] == [0] * len(p) + [1] * len(c)
    # SmolLM2 writes the forced arguments over several lines; the template's tojson writes one
    assert manifest["tool_calls"]["turns"] == 1
    assert manifest["tool_calls"]["rendered_differently"] == 1, manifest["tool_calls"]
    tok = AutoTokenizer.from_pretrained(smollm2_hf)
    prompt = tok.decode(sample["turns"][0]["prompt_token_ids"])
    assert "# Tools" in prompt and '"name": "get_weather"' in prompt
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
            in prompt and '<tool_response>\n{"rain": 0.9}\n</tool_response>' in prompt)
