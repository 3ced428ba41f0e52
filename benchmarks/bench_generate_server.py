"""``specdraft generate --backend openai`` against a real ``vllm serve`` under load and faults.

Two endpoints: vLLM (a tiny random Llama built here from a config, float32, eager, on
127.0.0.1) and a loopback server that answers every request with HTTP 500, 429 or a 200 that is
not JSON, in turn. ``specdraft generate`` (a subprocess, the real CLI) runs with ``--concurrency``
requests in flight; once ``--kill-after`` samples are on disk the vLLM server's whole process
group is SIGKILLed and started again on the same port. One prompt is longer than
``--max-model-len``: vLLM refuses it with HTTP 400, a reject with reason ``error``.

Prints the counts and the figures: requests/s and completion tokens/s over the whole run
(restart included) and over the time vLLM was up, and, with ``--clean``, the same generation
without faults for comparison. ``tests/engine/test_vllm_server_faults.py`` runs
:func:`run_under_faults` and checks the output line by line.

    python benchmarks/bench_generate_server.py [--prompts 256] [--concurrency 64]
        [--max-tokens 16] [--kill-after 128] [--clean]

Needs the vLLM venv (``SPECDRAFT_VLLM_PYTHON`` or ``.venv-vllm/bin/python``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from specdraft.generate.fakeserver import LoopbackServer, Reply

REPO = Path(__file__).resolve().parents[1]
SERVED = "tiny"

#: What the failing endpoint answers, in turn (kind as the client counts it, reply).
BAD_REPLIES = (("http_5xx", Reply(500, {"error": "boom"})),
               ("http_429", Reply(429, {"error": "slow down"})),
               ("malformed", Reply(200, b'{"choices": [{"mess')))


class FailingHandler:
    """Answers every request with the next of :data:`BAD_REPLIES`; ``sent`` counts by kind."""

    def __init__(self) -> None:
        self._turn = itertools.count()
        self.sent: Counter[str] = Counter()

    async def __call__(self, body: dict[str, Any]) -> Reply:
        kind, reply = BAD_REPLIES[next(self._turn) % len(BAD_REPLIES)]
        self.sent[kind] += 1
        return reply


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """``vllm.entrypoints.openai.api_server`` on ``127.0.0.1:port`` in its own process group
    (float32, eager, ``VLLM_CPU_KVCACHE_SPACE=1`` GiB); :meth:`kill` SIGKILLs the group,
    :meth:`start` starts it again on the same port. The log of every start is appended to
    ``log_path``."""

    def __init__(self, python: str, model: Path, log_path: Path, *, port: int = 0,
                 max_model_len: int = 512) -> None:
        self.python, self.model, self.log_path = python, model, log_path
        self.port = port or free_port()
        self.max_model_len = max_model_len
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 900) -> float:
        """Start and wait until ``GET /v1/models`` answers 200; return the seconds taken.
        Raises RuntimeError (with the log tail) if it exits or is not up within ``timeout_s``."""
        t0 = time.monotonic()
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": ""}
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model",
                 str(self.model), "--served-model-name", SERVED, "--host", "127.0.0.1",
                 "--port", str(self.port), "--dtype", "float32", "--enforce-eager",
                 "--max-model-len", str(self.max_model_len)],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/models", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"vLLM not up after {timeout_s:.0f} s: {self.log_path}")
            time.sleep(0.5)

    def kill(self) -> None:
        """SIGKILL the server's whole process group (API server and engine core) and reap it."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)
        self.proc = None


class LoadGauge:
    """Samples vLLM's ``/metrics`` (``vllm:num_requests_running`` + ``_waiting``) every
    ``interval_s`` in a thread; ``peak`` is the most requests the server held at once."""

    def __init__(self, url: str, interval_s: float = 0.1) -> None:
        self.metrics = url.removesuffix("/v1") + "/metrics"
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                text = httpx.get(self.metrics, timeout=2).text
            except httpx.HTTPError:
                continue  # the server is down (killed on purpose)
            held = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(("vllm:num_requests_running",
                                           "vllm:num_requests_waiting")))
            self.peak = max(self.peak, int(held))

    def __enter__(self) -> "LoadGauge":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def write_prompts(path: Path, n: int, *, too_long_words: int = 0) -> list[str]:
    """``n`` short questions ``q0..q{n-1}``, plus ``too_long`` (``too_long_words`` words, longer
    than the server's context) when asked; returns the ids."""
    rows = [{"id": f"q{i}", "question": f"Question {i}: what is {i} plus {i + 1}?"}
            for i in range(n)]
    if too_long_words:
        rows.append({"id": "too_long", "question": "word " * too_long_words})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [r["id"] for r in rows]


def generate_argv(prompts: Path, run_dir: Path, endpoints: list[str], *, concurrency: int,
                  max_tokens: int) -> list[str]:
    """The ``specdraft generate`` command line: a retry budget (100 retries, delays up to
    10 s: about 12 minutes) that outlasts a vLLM restart on a busy machine (30-60 s measured,
    more under load), small flush batches."""
    argv = [sys.executable, "-m", "specdraft.cli", "generate", "--backend", "openai",
            "--prompts", str(prompts), "--run-dir", str(run_dir), "--model", SERVED,
            "--concurrency", str(concurrency), "--max-tokens", str(max_tokens),
            "--keep-truncated", "--max-retries", "100", "--backoff-base-s", "0.5",
            "--backoff-max-s", "10", "--timeout-s", "600", "--flush-every", "8",
            "--flush-interval-s", "1", "--progress-interval-s", "10"]
    for e in endpoints:
        argv += ["--endpoint", e]
    return argv


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def run_under_faults(server: VllmServer, work: Path, *, prompts: int, concurrency: int,
                     max_tokens: int, kill_after: int, hang_bound_s: float = 1800
                     ) -> dict[str, Any]:
    """The scenario of the module docstring with ``server`` already up. Returns the generate
    manifest, the failing endpoint's replies by kind, its URL, the ids written to the prompt
    file, the seconds of the run and of the outage, vLLM's restart time, the server's peak
    load and the generate log. Raises RuntimeError on a hang (``hang_bound_s``)."""
    ids = write_prompts(work / "prompts.jsonl", prompts, too_long_words=server.max_model_len + 64)
    run_dir, bad = work / "run", FailingHandler()
    samples = run_dir / "generate" / "samples.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    with LoopbackServer(bad) as bad_url, LoadGauge(server.url) as gauge, \
            open(work / "generate.log", "w+") as log:
        argv = generate_argv(work / "prompts.jsonl", run_dir, [server.url, bad_url],
                             concurrency=concurrency, max_tokens=max_tokens)
        t0 = time.monotonic()
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            while _lines(samples) < kill_after and child.poll() is None:
                _hang_check(t0, hang_bound_s, "the first samples")
                time.sleep(0.02)
            killed_at_samples = _lines(samples)
            t_kill = time.monotonic()
            server.kill()
            time.sleep(1.0)  # requests meet a closed port before the restart begins
            restart_s = server.start()
            outage_s = time.monotonic() - t_kill
            child.wait(timeout=max(1.0, hang_bound_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"generate did not finish in {hang_bound_s:.0f} s") from None
        finally:
            if child.poll() is None:
                child.kill()
        wall_s = time.monotonic() - t0
        log.seek(0)
        text = log.read()
    if child.returncode != 0:
        raise RuntimeError(f"generate exited {child.returncode}: {text[-3000:]}")
    manifest = json.loads((run_dir / "generate" / "manifest.json").read_text())
    return {"manifest": manifest, "bad_sent": dict(bad.sent), "bad_url": bad_url, "ids": ids,
            "run_dir": run_dir, "wall_s": wall_s, "outage_s": outage_s, "restart_s": restart_s,
            "killed_at_samples": killed_at_samples, "peak_load": gauge.peak, "log": text}


def _hang_check(t0: float, bound_s: float, what: str) -> None:
    if time.monotonic() - t0 > bound_s:
        raise RuntimeError(f"no {what} within {bound_s:.0f} s")


def clean_run(server: VllmServer, work: Path, *, prompts: int, concurrency: int,
              max_tokens: int) -> dict[str, Any]:
    """The same prompts (without the over-long one) against vLLM alone, no faults."""
    write_prompts(work / "clean.jsonl", prompts)
    argv = generate_argv(work / "clean.jsonl", work / "clean_run", [server.url],
                         concurrency=concurrency, max_tokens=max_tokens)
    t0 = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    wall_s = time.monotonic() - t0
    m = json.loads((work / "clean_run" / "generate" / "manifest.json").read_text())
    return {"manifest": m, "wall_s": wall_s}


def figures(manifest: dict[str, Any], wall_s: float) -> str:
    """``N requests, T tokens: R req/s, K tok/s`` over ``wall_s`` (answered prompts and
    completion tokens from the manifest; the generate process's start-up included)."""
    n = manifest["counts"]["samples"]
    tokens = manifest["summary"]["completion_tokens"]
    return (f"{n} answered, {tokens} completion tokens in {wall_s:.1f} s: "
            f"{n / wall_s:.2f} req/s, {tokens / wall_s:.1f} tok/s")


def build_tiny_verifier(out: Path) -> Path:
    """A 4-layer random Llama (hidden 64, 2 heads: head_dim 32, the smallest vLLM's CPU
    attention takes; weight std 0.3 so answers vary) with the SmolLM2 tokenizer."""
    import shutil

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from specdraft.core.verifier import smollm2_gguf

    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=2048, tie_word_embeddings=False,
                         initializer_range=0.3, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(config).eval().save_pretrained(out)
    return out


def vllm_python() -> str:
    path = os.environ.get("SPECDRAFT_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not Path(path).exists():
        sys.exit(f"{path} not found: set SPECDRAFT_VLLM_PYTHON (make install-vllm)")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--kill-after", type=int, default=128, help="samples on disk before the kill")
    ap.add_argument("--clean", action="store_true", help="also time a run without faults")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_generate_server_"))
    model = build_tiny_verifier(work / "model")
    server = VllmServer(vllm_python(), model, work / "vllm.log")
    try:
        print(f"vLLM up in {server.start():.1f} s", flush=True)
        r = run_under_faults(server, work, prompts=args.prompts, concurrency=args.concurrency,
                             max_tokens=args.max_tokens, kill_after=args.kill_after)
        m = r["manifest"]
        print(f"killed vLLM after {r['killed_at_samples']} samples on disk; down "
              f"{r['outage_s']:.1f} s (restart {r['restart_s']:.1f} s); peak load on vLLM "
              f"{r['peak_load']} requests (its gauges) and {m['peak_in_flight']} posted at once "
              f"(generate's manifest)")
        print(f"counts: {m['counts']}\nretries: {m['retries']}\nfailed: {m['failed_requests']}")
        print(f"failing endpoint sent: {r['bad_sent']}")
        print("under faults, whole run:  " + figures(m, r["wall_s"]))
        print("under faults, vLLM up:    " + figures(m, r["wall_s"] - r["outage_s"]))
        if args.clean:
            c = clean_run(server, work, prompts=args.prompts, concurrency=args.concurrency,
                          max_tokens=args.max_tokens)
            print("no faults:                " + figures(c["manifest"], c["wall_s"]))
    finally:
        server.kill()
    print(f"work dir: {work}")


if __name__ == "__main__":
    main()
