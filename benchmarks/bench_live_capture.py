"""Benchmark: hidden-state capture through a live ``specdraft serve`` against the offline vLLM
engine backend, and the demo job staged against one deployment (SmolLM2-135M GGUF converted once
to an HF directory, fp32, bf16 storage, real GSM8K questions). Written for the lead to run; not
run by its author.

Prints, in one run (medians of ``--reps``):

1. capture rows/s and tokens/s on the same prepared rows: ``extract --backend vllm`` (whole
   stage, and its engine once ``vllm.LLM`` is built) against ``extract --endpoint`` through a
   server already up (``--endpoint-concurrency`` requests in flight); the server's start is
   printed apart (paid once per deployment);
2. end to end, the demo job's generate + prepare + extract: **staged** (a plain vLLM server for
   generate, stopped; then ``extract --backend vllm``, which loads the verifier again) against
   **one deployment** (``specdraft serve``: generate through it, then ``extract --endpoint``
   through the same server). Wall seconds of each, the server and engine starts included.

Usage: ``python benchmarks/bench_live_capture.py [--samples 32] [--max-tokens 128] [--reps 3]
[--concurrency 8]`` (``VLLM_CPU_KVCACHE_SPACE=1`` unless set; needs ``.venv-vllm`` and
``../shared/data/gsm8k``). Engines run one at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
sys.path.insert(0, str(REPO / "tests" / "extract"))
sys.path.insert(0, str(REPO / "benchmarks"))


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


@contextlib.contextmanager
def served(run_dir: Path, hf_dir: Path, *, capture: bool):
    """``specdraft serve`` of ``hf_dir`` (capture on), or the same server without the capture
    settings (``capture=False``: what the staged job runs for generate). Yields ``(url,
    seconds to ready)``."""
    from specdraft.engines.launcher import free_port, http_ready, launch
    from specdraft.engines.live import log_path, prepare, start
    from specdraft.engines.live_config import ServeConfig
    from specdraft.engines.worker import worker_env

    cfg = ServeConfig(run_dir=run_dir, verifier=str(hf_dir), port=free_port(), dtype="float32",
                      max_model_len=2048, extra_args="--enforce-eager", startup_s=900)
    t0 = time.perf_counter()
    if capture:
        with start(cfg) as (url, _, _):
            yield url, time.perf_counter() - t0
        return
    cmd, url = prepare(cfg)
    plain = cmd[:cmd.index("--speculative-config")] + cmd[cmd.index("--kv-transfer-config") + 2:]
    i = plain.index("--served-model-name")
    del plain[i + 2]  # the capture descriptor name: no capture here
    log = log_path(cfg)
    with launch(plain, log, name="the vLLM server", env=worker_env(log.parent),
                ready=http_ready(url, ("/health",)), startup_s=900):
        yield url, time.perf_counter() - t0


def extract(run_dir: Path, hf_dir: Path, **kw) -> dict:
    from specdraft.extract.config import ExtractConfig
    from specdraft.extract.run import run

    return run(ExtractConfig(run_dir=run_dir, verifier=str(hf_dir), dtype="float32",
                             device="cpu", storage="bf16", overwrite=True, **kw))


def capture_rates(args: argparse.Namespace, hf_dir: Path, root: Path) -> None:
    """Part 1: the same rows through both backends."""
    from bench_extract import prepared_rows
    from extract_helpers import write_prepared
    from specdraft.core.verifier import load_tokenizer

    ids, masks = prepared_rows(load_tokenizer("smollm2"), args.samples)
    offline = write_prepared(root / "offline", ids, masks)
    live = write_prepared(root / "live", ids, masks)
    figures: dict[str, list[float]] = {k: [] for k in (
        "offline_rows", "offline_tok", "engine_tok", "engine_init", "live_rows", "live_tok")}
    with served(live, hf_dir, capture=True) as (url, ready_s):
        for _ in range(args.reps):
            t = extract(live, hf_dir, endpoint=[url], endpoint_concurrency=args.concurrency)
            t = t["throughput"][0]
            figures["live_rows"].append(t["samples"] / t["seconds"])
            figures["live_tok"].append(t["tokens_per_s"])
    for _ in range(args.reps):  # one engine at a time: after the server is stopped
        t = extract(offline, hf_dir, backend="vllm")["throughput"][0]
        figures["offline_rows"].append(t["samples"] / t["seconds"])
        figures["offline_tok"].append(t["tokens_per_s"])
        figures["engine_tok"].append(t["engine_tokens_per_s"])
        figures["engine_init"].append(t["engine_init_s"])
    med = {k: _median(v) for k, v in figures.items()}
    tokens = sum(len(r) for r in ids)
    print(f"1. capture, SmolLM2-135M fp32 CPU, {len(ids)} GSM8K rows, {tokens} tokens, "
          f"bf16 storage, medians of {args.reps}")
    print(f"   extract --backend vllm (whole stage): {med['offline_rows']:7.2f} rows/s "
          f"{med['offline_tok']:8.0f} tok/s (engine start {med['engine_init']:.0f} s each run)")
    print(f"   its engine once built:                            {med['engine_tok']:8.0f} tok/s")
    print(f"   extract --endpoint (server up):       {med['live_rows']:7.2f} rows/s "
          f"{med['live_tok']:8.0f} tok/s (server start {ready_s:.0f} s, once); "
          f"ratio to the offline stage {med['live_tok'] / med['offline_tok']:.2f}")


def _generate(run_dir: Path, url: str, prompts: Path, hf_dir: Path, max_tokens: int) -> None:
    from specdraft.generate.config import GenerateConfig
    from specdraft.generate.run import run as generate
    from specdraft.prepare.config import PrepareConfig
    from specdraft.prepare.run import run as prepare

    generate(GenerateConfig(prompts=str(prompts), run_dir=str(run_dir), backend="openai",
                            endpoint=[url + "/v1"], concurrency=16, max_tokens=max_tokens,
                            keep_truncated=True, timeout_s=900, verifier=str(hf_dir)),
             stream=io.StringIO())
    prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(hf_dir)))


def end_to_end(args: argparse.Namespace, hf_dir: Path, root: Path) -> None:
    """Part 2: generate + prepare + extract, staged against one deployment."""
    prompts = root / "prompts.jsonl"
    rows = GSM8K.read_text().splitlines()[:args.samples]
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "question": json.loads(r)["question"]})
                               + "\n" for i, r in enumerate(rows)))
    staged, one = [], []
    for rep in range(args.reps):
        run_a, run_b = root / f"staged{rep}", root / f"one{rep}"
        t0 = time.perf_counter()
        with served(run_a, hf_dir, capture=False) as (url, _):
            _generate(run_a, url, prompts, hf_dir, args.max_tokens)
        extract(run_a, hf_dir, backend="vllm")  # the verifier loaded again
        staged.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with served(run_b, hf_dir, capture=True) as (url, _):
            _generate(run_b, url, prompts, hf_dir, args.max_tokens)
            extract(run_b, hf_dir, endpoint=[url], endpoint_concurrency=args.concurrency)
        one.append(time.perf_counter() - t0)
        shutil.rmtree(run_a, ignore_errors=True)
        shutil.rmtree(run_b, ignore_errors=True)
    print(f"2. demo job generate + prepare + extract, {args.samples} GSM8K prompts, "
          f"{args.max_tokens} new tokens, medians of {args.reps}")
    print(f"   staged (server for generate, stopped; extract --backend vllm): "
          f"{_median(staged):7.1f} s")
    print(f"   one deployment (specdraft serve; generate; extract --endpoint): "
          f"{_median(one):7.1f} s   ratio {_median(one) / _median(staged):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--hf-dir", default=None, help="where the converted SmolLM2 HF directory "
                                                   "is cached")
    args = ap.parse_args()
    from specdraft.core.verifier import smollm2_gguf
    from specdraft.engines.verifier_dir import gguf_to_hf_dir

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    hf_dir = gguf_to_hf_dir(smollm2_gguf(), Path(args.hf_dir) if args.hf_dir else
                            Path(tempfile.gettempdir()) / "specdraft_bench_smollm2_hf")
    root = Path(tempfile.mkdtemp(prefix="bench_live_capture_"))
    capture_rates(args, hf_dir, root)
    end_to_end(args, hf_dir, root)


if __name__ == "__main__":
    main()
