"""Offline eval speed at several batch sizes on the SmolLM2 GGUF verifier and GSM8K prompts.

Decodes the same prompts with ``--batch-size`` 1 and N (interleaved repetitions, medians: the
cores are shared and the load drifts), checks that every batch size gives identical tokens and
counts (drafted, accepted, per step), and prints tokens/s and the speed-up over batch 1.

The drafter is random (no training here), so τ ≈ 1 and each verify step commits about one
token: the figure measures the decoding loop itself; a trained drafter's τ multiplies both.

Usage: ``python benchmarks/bench_eval.py [--prompts 16] [--batch-sizes 1,8] [--max-new-tokens 32]
[--k 3] [--reps 1] [--threads N]``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"


def prompt_ids(tok, n: int) -> list[list[int]]:
    """The first n GSM8K test questions in the SmolLM2 chat template."""
    out = []
    for line in GSM8K.read_text().splitlines()[:n]:
        enc = tok.apply_chat_template([{"role": "user", "content": json.loads(line)["question"]}],
                                      add_generation_prompt=True, tokenize=True)
        out.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    return out


def decode_once(verifier, drafter, prompts, batch_size: int, args) -> tuple[float, list]:
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import decode

    cfg = EvalConfig(drafter=REPO, out=REPO / "unused", prompts=GSM8K, k=args.k,
                     max_new_tokens=args.max_new_tokens, batch_size=batch_size)
    t0 = time.perf_counter()
    gens = decode(cfg, verifier, drafter, prompts, [])
    return time.perf_counter() - t0, gens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from specdraft.core.verifier import load_tokenizer, load_verifier
    from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel

    verifier = load_verifier("smollm2", dtype="float32", device="cpu")
    n = verifier.config.num_hidden_layers
    c = Eagle3Config.from_verifier(verifier.config, draft_vocab_size=verifier.config.vocab_size,
                                   aux_layer_ids=(2, n // 2, n - 3))
    torch.manual_seed(0)
    drafter = Eagle3DraftModel(c).eval()
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(verifier.get_input_embeddings().weight)
    prompts = prompt_ids(load_tokenizer("smollm2"), args.prompts)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    times: dict[int, list[float]] = {b: [] for b in sizes}
    outputs = {}
    for _ in range(args.reps):
        for b in sizes:
            s, gens = decode_once(verifier, drafter, prompts, b, args)
            times[b].append(s)
            print(f"  (batch {b}: {s:.1f} s)", flush=True)
            outputs[b] = [(g.tokens, [(x.k, x.accepted) for x in g.stats.steps]) for g in gens]
    same = all(outputs[b] == outputs[sizes[0]] for b in sizes)
    tokens = sum(len(t) for t, _ in outputs[sizes[0]])
    steps = sum(len(s) for _, s in outputs[sizes[0]])
    print(f"SmolLM2-135M (fp32, CPU, {torch.get_num_threads()} threads, load average "
          f"{os.getloadavg()[0]:.1f}), {len(prompts)} GSM8K prompts, k {args.k}, "
          f"{tokens} new tokens, {steps} verify steps, medians of {args.reps}")
    one = min(sizes)
    base = sorted(times[one])[len(times[one]) // 2]  # speed-up over the smallest batch
    for b in sizes:
        med = sorted(times[b])[len(times[b]) // 2]
        print(f"  batch {b:3d}: {med:7.1f} s  {tokens / med:7.1f} tok/s  speed-up "
              f"{base / med:.2f}x")
    print(f"  identical tokens and counts at every batch size: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
