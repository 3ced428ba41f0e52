"""Throughput of the ``openai`` backend's client against a zero-latency loopback server.

The server (:mod:`specdraft.generate.fakeserver`) runs in its own process, so the CPU time
measured here (``time.process_time`` of this process) is the client's alone: request encoding,
httpx, response parsing and the retry/load-spread bookkeeping of ``OpenAIBackend.complete``.

    python benchmarks/bench_generate_client.py [--requests 5000] [--concurrency 256]

Target: >= 1,000 req/s, so the client is never the bottleneck of a real server.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

from specdraft.generate.client import OpenAIBackend


async def _bench(url: str, n: int, concurrency: int) -> tuple[float, float, int]:
    body = {"max_tokens": 64, "temperature": 0.0, "return_token_ids": True}
    async with OpenAIBackend([url], model="loopback-model", body_defaults=body,
                             concurrency=concurrency, timeout_s=60, max_retries=3) as be:
        await be.complete([{"role": "user", "content": "warm up"}])
        todo = iter(range(n))

        async def worker() -> None:
            for i in todo:
                await be.complete([{"role": "user", "content": f"question number {i}?"}])

        wall0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        return wall, cpu, sum(be.retries.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=256)
    args = ap.parse_args()
    server = subprocess.Popen([sys.executable, "-m", "specdraft.generate.fakeserver"],
                              stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        wall, cpu, retries = asyncio.run(_bench(url, args.requests, args.concurrency))
    finally:
        server.terminate()
        server.wait()
    print(f"requests: {args.requests}  concurrency: {args.concurrency}  retries: {retries}")
    print(f"throughput: {args.requests / wall:.0f} req/s  ({wall:.2f} s wall)")
    print(f"client CPU: {1000 * cpu / args.requests:.3f} ms/request")


if __name__ == "__main__":
    main()
