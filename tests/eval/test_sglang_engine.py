"""`eval --engine sglang` without SGLang: the launch command, τ from a fake native /generate,
and the server process always stopped."""

import sys
from pathlib import Path

import httpx
import pytest

from specdraft.core.errors import InputError
from specdraft.eval import sglang
from specdraft.engines.process import EngineError


def fake_sglang(verify_ct):
    seen = []

    def handler(req):
        if req.url.path == "/generate":
            import json

            body = json.loads(req.content)
            seen.append(body)
            n = len(body["input_ids"])
            return httpx.Response(200, json={"output_ids": list(range(n)), "meta_info": {
                "completion_tokens": 2 * n, "spec_verify_ct": verify_ct(n)}})
        if req.url.path == "/get_server_info":
            return httpx.Response(200, json={"internal_states": [{"avg_spec_accept_length": 2.5}]})
        return httpx.Response(404)
    return handler, seen


def test_tau_from_meta_info():
    handler, seen = fake_sglang(lambda n: n)
    client = httpx.Client(base_url="http://fake", transport=httpx.MockTransport(handler))
    r = sglang.sglang_eval(client, [[1, 2, 3], [4]], max_tokens=8, temperature=0.0,
                           stop_ids=[2])
    # completion 6 + 2 = 8 tokens over 3 + 1 = 4 verify forwards
    assert r["tau"] == pytest.approx(2.0) and r["verify_steps"] == 4 and r["new_tokens"] == 8
    assert r["server_avg_spec_accept_length"] == 2.5 and r["tokens"] == [[0, 1, 2], [0]]
    assert seen[0] == {"input_ids": [1, 2, 3], "sampling_params": {
        "max_new_tokens": 8, "temperature": 0.0, "stop_token_ids": [2]}}


def test_no_verify_steps_is_an_error():
    handler, _ = fake_sglang(lambda n: 0)
    client = httpx.Client(base_url="http://fake", transport=httpx.MockTransport(handler))
    with pytest.raises(InputError, match="no spec_verify_ct"):
        sglang.sglang_eval(client, [[1]], max_tokens=4, temperature=0.0, stop_ids=[])


def test_launch_command_chain_k():
    cmd = sglang.launch_command("py", Path("/v"), Path("/d"), k=3, port=1234, dtype="bfloat16")
    line = " ".join(cmd)
    assert line.startswith("py -m sglang.launch_server --model-path /v ")
    assert ("--speculative-algorithm EAGLE3 --speculative-draft-model-path /d "
            "--speculative-num-steps 3 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 4") in line
    assert "--host 127.0.0.1 --port 1234" in line


def test_server_that_dies_is_reported_and_one_that_hangs_is_stopped(tmp_path):
    dies = [sys.executable, "-c", "import sys; print('CUDA not available'); sys.exit(1)"]
    with pytest.raises(EngineError, match="CUDA not available"):
        with sglang.launch_server(dies, tmp_path / "a.log", port=sglang.free_port(),
                                  timeout_s=30):
            pass
    pid_file = tmp_path / "pid"
    hangs = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w')"
             ".write(str(os.getpid())); time.sleep(60)"]
    with pytest.raises(EngineError, match="did not come up"):
        with sglang.launch_server(hangs, tmp_path / "b.log", port=sglang.free_port(),
                                  timeout_s=3):
            pass
    status = Path(f"/proc/{pid_file.read_text()}/status")
    assert not status.exists() or "State:\tZ" in status.read_text()
