"""Resume proven by kill -9: six prompts that the server completes in the order
p3, p0, p5, p1, p4, p2; the job (a real subprocess) is SIGKILLed once samples.jsonl holds three
lines, a torn line is appended as a crash mid-write would leave it, and ``--resume`` finishes the
job: every id exactly once, none missing, only the missing ones requested again."""

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

from specdraft.generate.config import GenerateConfig
from specdraft.generate.fakeserver import LoopbackServer, last_user, vllm_reply
from specdraft.generate.run import run

ORDER = ["p3", "p0", "p5", "p1", "p4", "p2"]
CHILD = ("import json, sys; from specdraft.generate.config import GenerateConfig; "
         "from specdraft.generate.run import run; "
         "run(GenerateConfig(**json.loads(sys.argv[1])))")


class OrderedHandler:
    """Answers in ORDER; the last three wait until ``release`` is set (after the kill)."""

    def __init__(self):
        self.release = threading.Event()
        self.after_release = []

    async def __call__(self, body):
        user = last_user(body)
        rank = ORDER.index(user)
        if self.release.is_set():
            self.after_release.append(user)
        if rank < 3:
            await asyncio.sleep(0.3 * (rank + 1))
        else:
            while not self.release.is_set():
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3 * (rank - 2))
        return vllm_reply(body)


def _ids(path):
    return [json.loads(l)["id"] for l in path.read_text().splitlines()]


def test_kill_after_three_writes_then_resume(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"p{i}"}) + "\n"
                               for i in range(6)))
    samples = tmp_path / "run/generate/samples.jsonl"
    handler = OrderedHandler()
    with LoopbackServer(handler) as url:
        settings = dict(prompts=str(prompts), run_dir=str(tmp_path / "run"), backend="openai",
                        endpoint=[url], concurrency=6, flush_every=1, max_retries=0)
        child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(settings)],
                                 stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not (samples.exists() and samples.read_text().count("\n") >= 3):
            assert child.poll() is None, child.stderr.read().decode()
            assert time.monotonic() < deadline, "child never wrote three samples"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        assert child.returncode == -signal.SIGKILL
        assert _ids(samples) == ["p3", "p0", "p5"]  # completion order, one line each
        assert not (tmp_path / "run/generate/manifest.json").exists()
        with open(samples, "a") as f:  # what a crash in the middle of a write leaves
            f.write('{"id": "p1", "messages": [{"ro')
        handler.release.set()
        log = io.StringIO()
        m = run(GenerateConfig(**settings, resume=True), stream=log)
    assert "cut a torn last line (30 bytes)" in log.getvalue()
    assert m["torn_tail_bytes_cut"]["samples.jsonl"] == 30
    assert sorted(handler.after_release) == ["p1", "p2", "p4"]  # only the missing ones
    assert _ids(samples) == ["p3", "p0", "p5", "p1", "p4", "p2"]
    assert m["counts"]["already_done"] == 3 and m["counts"]["samples"] == 6
    assert m["counts"]["finished_this_run"] == 3 and m["counts"]["rejected"] == {}


CHILD_INT = ("import json, sys; from specdraft.generate.config import GenerateConfig; "
             "from specdraft.generate.run import run\n"
             "try:\n    run(GenerateConfig(**json.loads(sys.argv[1])))\n"
             "except KeyboardInterrupt:\n    sys.exit(130)")


def test_ctrl_c_writes_finished_results(tmp_path):
    """SIGINT while three results sit unflushed in the buffer (flush_every=100): they are
    written, no manifest, and --resume finishes the rest."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"p{i}"}) + "\n"
                               for i in range(6)))
    samples = tmp_path / "run/generate/samples.jsonl"
    handler = OrderedHandler()
    answered = []

    async def counting(body):
        reply = await handler(body)
        answered.append(last_user(body))
        return reply

    with LoopbackServer(counting) as url:
        settings = dict(prompts=str(prompts), run_dir=str(tmp_path / "run"), backend="openai",
                        endpoint=[url], concurrency=6, flush_every=100, flush_interval_s=600,
                        max_retries=0)
        child = subprocess.Popen([sys.executable, "-c", CHILD_INT, json.dumps(settings)])
        deadline = time.monotonic() + 60
        while len(answered) < 3:
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.01)
        time.sleep(2.0)  # let the child parse the third response (a loaded machine is slow)
        assert not samples.exists() or samples.read_text() == ""  # still buffered
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=60) == 130  # generous: a loaded CI machine is slow to exit
        assert _ids(samples) == ["p3", "p0", "p5"]
        assert not (tmp_path / "run/generate/manifest.json").exists()
        handler.release.set()
        m = run(GenerateConfig(**settings, resume=True), stream=io.StringIO())
    assert sorted(_ids(samples)) == [f"p{i}" for i in range(6)]
    assert m["counts"]["samples"] == 6 and m["counts"]["already_done"] == 3
