"""The teacher check's natural gap: KL(fresh || stored) and top-1 agreement per storage format.

The stored final states of GSM8K rows (question + reference answer in the verifier's chat
template, the answer supervised) are rounded through each extract codec and compared with a
fresh forward by :func:`specdraft.artifacts.teacher_check.compare_row`, over the full vocabulary.
These figures set :data:`specdraft.artifacts.teacher_check.TOLERANCE`.

    python benchmarks/teacher_gap.py --rows 8 [--verifier smollm2]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k" / "train.jsonl"


def rows_dataset(tokenizer, n: int):
    """A prepare-style in-memory dataset of ``n`` GSM8K rows (the answer is supervised)."""
    from datasets import Dataset

    ids, masks = [], []
    for line in SHARED.read_text().splitlines()[:n]:
        rec = json.loads(line)
        chat = [{"role": "user", "content": rec["question"]}]
        prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(rec["answer"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
        ids.append(p + a)
        masks.append([0] * len(p) + [1] * len(a))
    return Dataset.from_dict({"input_ids": ids, "loss_mask": masks,
                              "sample_id": [f"g{i}" for i in range(n)],
                              "turn_index": [0] * n, "seq_len": [len(r) for r in ids]})


def gap(stored_model, fresh_model, ds, storage: str) -> dict:
    from specdraft.artifacts.hidden_states import OnlineSource
    from specdraft.artifacts.batches import Collator
    from specdraft.artifacts.teacher_check import compare_row

    src = OnlineSource(stored_model, ds, [2, 15, 27], storage=storage)
    head = stored_model.get_output_embeddings().weight.detach()
    collator = Collator(head, torch.zeros(head.shape[0], dtype=torch.long), torch.device("cpu"))
    rows = [compare_row(r, fresh_model, collator) for r in src.get_batch(range(len(src)))]
    n = sum(r.positions for r in rows)
    return {"storage": storage, "positions": n,
            "kl_mean": sum(r.kl_mean * r.positions for r in rows) / n,
            "kl_max": max(r.kl_max for r in rows),
            "top1": sum(r.top1 * r.positions for r in rows) / n}


def main() -> None:
    from specdraft.core.verifier import load_tokenizer, load_verifier

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--verifier", default="smollm2")
    args = ap.parse_args()
    tok = load_tokenizer(args.verifier)
    fp32 = load_verifier(args.verifier, dtype="float32")
    ds = rows_dataset(tok, args.rows)
    for storage in ("fp32", "bf16", "fp8"):
        print(json.dumps(gap(fp32, fp32, ds, storage)), flush=True)
    bf16 = load_verifier(args.verifier, dtype="bfloat16")
    print(json.dumps({"fresh": "bfloat16", **gap(fp32, bf16, ds, "fp32")}), flush=True)


if __name__ == "__main__":
    main()
