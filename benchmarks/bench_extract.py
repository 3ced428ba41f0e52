"""Benchmark of ``specdraft extract`` on the SmolLM2 GGUF verifier and real GSM8K samples.

Prints, in one run:

1. extract tokens/s ÷ bare-forward tokens/s on the same batches (target ≥ 0.90; the writer thread
   overlaps encoding and disk writes with the next forward). Two baselines: the full
   ``model(input_ids)`` (with the LM head, what the issue names) and the base model alone
   (what extraction runs: no ``[B, T, V]`` logits), the stricter one.
2. stored bytes per token ÷ 8·H (four bf16 layers, the usual layout) for each storage option
   (target ≤ 0.5 with the compact options).

Usage: ``python benchmarks/bench_extract.py [--samples 64] [--batch-tokens 2048] [--reps 3]``
(medians of interleaved repetitions).

``--backend vllm`` instead compares the two backends on the same rows (the SmolLM2 GGUF
converted once to an HF directory, fp32, bf16 storage): transformers extract tokens/s against
the vLLM backend's, for the whole stage and for the engine once ``vllm.LLM`` is built (one engine start per rep;
``VLLM_CPU_KVCACHE_SPACE=1`` unless set).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
sys.path.insert(0, str(REPO / "tests" / "extract"))


def prepared_rows(tok, n: int) -> tuple[list[list[int]], list[list[int]]]:
    """GSM8K prompt (mask 0) + answer and <|im_end|> (mask 1) in the SmolLM2 chat template."""
    ids, masks = [], []
    for line in GSM8K.read_text().splitlines()[:n]:
        rec = json.loads(line)
        enc = tok.apply_chat_template([{"role": "user", "content": rec["question"]}],
                                      add_generation_prompt=True, tokenize=True)
        prompt = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
        answer = tok(rec["answer"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
        ids.append(prompt + answer)
        masks.append([0] * len(prompt) + [1] * len(answer))
    return ids, masks


@torch.no_grad()
def bare_tokens_per_s(model, ids, masks, batch_tokens: int, base_only: bool) -> float:
    """Tokens/s of the plain forward over the same length-sorted padded batches."""
    from specdraft.core.batching import pad_rows, plan_batches

    batches = plan_batches([len(r) for r in ids], batch_tokens)
    fn = model.model if base_only else model
    tokens, t0 = 0, time.perf_counter()
    for b in batches:
        p = pad_rows([ids[i] for i in b.rows], [masks[i] for i in b.rows])
        fn(input_ids=p.input_ids, attention_mask=p.attention_mask,
           position_ids=p.position_ids, use_cache=False)
        tokens += int(p.lengths.sum())
    return tokens / (time.perf_counter() - t0)


def extract_once(model, run_dir: Path, storage: str, batch_tokens: int) -> dict:
    from specdraft.extract.config import ExtractConfig
    from specdraft.extract.run import run

    cfg = ExtractConfig(run_dir=run_dir, verifier="smollm2", storage=storage,
                        batch_tokens=batch_tokens, overwrite=True)
    return run(cfg, verifier=model)


def compare_backends(args: argparse.Namespace) -> None:
    """transformers vs vLLM extract tokens/s on the same prepared rows (medians over reps)."""
    import os

    from extract_helpers import write_prepared
    from specdraft.core.verifier import load_tokenizer, smollm2_gguf
    from specdraft.engines.verifier_dir import gguf_to_hf_dir
    from specdraft.extract.config import ExtractConfig
    from specdraft.extract.run import run

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    tmp = Path(tempfile.mkdtemp(prefix="bench_extract_vllm_"))
    hf_dir = gguf_to_hf_dir(smollm2_gguf(), Path(args.hf_dir) if args.hf_dir else
                            Path(tempfile.gettempdir()) / "specdraft_bench_smollm2_hf")  # cached
    ids, masks = prepared_rows(load_tokenizer("smollm2"), args.samples)
    run_dir = write_prepared(tmp / "run", ids, masks)
    figures: dict[str, list[float]] = {"transformers": [], "vllm": [], "vllm_engine": [],
                                       "vllm_init_s": []}
    for _ in range(args.reps):
        for backend in ("transformers", "vllm"):
            m = run(ExtractConfig(run_dir=run_dir, verifier=str(hf_dir), backend=backend,
                                  dtype="float32", device="cpu", storage="bf16",
                                  batch_tokens=args.batch_tokens, overwrite=True))
            t = m["throughput"][0]
            figures[backend].append(t["tokens_per_s"])
            if backend == "vllm":
                figures["vllm_engine"].append(t["engine_tokens_per_s"])
                figures["vllm_init_s"].append(t["engine_init_s"])
    med = {k: sorted(v)[len(v) // 2] for k, v in figures.items()}
    print(f"SmolLM2-135M (fp32, CPU), {len(ids)} GSM8K rows, {m['counts']['tokens']} tokens, "
          f"bf16 storage, medians of {args.reps}")
    print(f"  transformers extract:              {med['transformers']:8.0f} tok/s")
    print(f"  vllm extract (whole stage):        {med['vllm']:8.0f} tok/s")
    print(f"  vllm engine after vllm.LLM built:  {med['vllm_engine']:8.0f} tok/s "
          f"(building it: {med['vllm_init_s']:.0f} s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
    ap.add_argument("--hf-dir", default=None, help="--backend vllm: where the converted SmolLM2 "
                                                   "HF directory is cached")
    args = ap.parse_args()
    if args.backend == "vllm":
        compare_backends(args)
        return

    from extract_helpers import write_prepared
    from specdraft.core.verifier import load_tokenizer, load_verifier

    model = load_verifier("smollm2", dtype="float32", device="cpu")
    ids, masks = prepared_rows(load_tokenizer("smollm2"), args.samples)
    run_dir = write_prepared(Path(tempfile.mkdtemp(prefix="bench_extract_")) / "run", ids, masks)
    bt = args.batch_tokens
    bare_tokens_per_s(model, ids, masks, bt, True)  # warm-up: every batch shape once
    full, base, ext, ext8 = [], [], [], []
    for _ in range(args.reps):  # interleaved: the 2 cores are shared, load drifts
        full.append(bare_tokens_per_s(model, ids, masks, bt, base_only=False))
        base.append(bare_tokens_per_s(model, ids, masks, bt, base_only=True))
        m = extract_once(model, run_dir, "bf16", bt)
        ext.append(m["throughput"][0]["tokens_per_s"])
        ext8.append(extract_once(model, run_dir, "fp8", bt)["throughput"][0]["tokens_per_s"])
    full, base, ext, ext8 = (sorted(x)[len(x) // 2] for x in (full, base, ext, ext8))  # medians
    H = m["hidden_size"]
    print(f"SmolLM2-135M (fp32, CPU, {torch.get_num_threads()} threads), {len(ids)} GSM8K rows, "
          f"{m['counts']['tokens']} tokens, aux ids {m['aux_layer_ids']}, batch {bt} tokens")
    print(f"  bare model(input_ids) forward:  {full:8.0f} tok/s")
    print(f"  bare base-model forward:         {base:8.0f} tok/s")
    for name, tps in (("bf16", ext), ("fp8", ext8)):
        print(f"  extract ({name}, writer thread):  {tps:8.0f} tok/s   ratio to model(input_ids) "
              f"{tps / full:.3f} (target >= 0.90), to the base forward {tps / base:.3f}")
    print(f"bytes per token ÷ 8·H (8·H = {8 * H} B):")
    sizes = {"bf16": m["storage"]}
    for storage in ("fp8", "bf16-zstd", "fp8-zstd"):
        sizes[storage] = extract_once(model, run_dir, storage, bt)["storage"]
    for name, st in sizes.items():
        print(f"  {name:10s} {st['bytes_per_token']:8.1f} B/token  ratio "
              f"{st['bytes_per_token_over_8H']:.3f}")


if __name__ == "__main__":
    main()
