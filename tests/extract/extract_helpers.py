"""Helpers for the extract tests: a hand-built prepare stage (dataset + manifest)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Sequence

from specdraft.core.config import StageConfig


class PrepareStub(StageConfig):
    """Stands in for the prepare stage's config in the hand-written manifest."""

    source: str = "tests/extract"


def write_prepared(run_dir: Path, input_ids: Sequence[Sequence[int]],
                   loss_mask: Sequence[Sequence[int]], sample_ids: Sequence[str] | None = None
                   ) -> Path:
    """Write ``RUN/prepare/dataset`` (the columns of docs/run-dir.md) and its manifest."""
    from datasets import Dataset, Features, Sequence as Seq, Value

    from specdraft.core.manifest import StageClock, write_manifest

    n = len(input_ids)
    features = Features({"input_ids": Seq(Value("int32")), "loss_mask": Seq(Value("uint8")),
                         "sample_id": Value("string"), "turn_index": Value("int32"),
                         "seq_len": Value("int32"), "truncated": Value("bool")})
    ds = Dataset.from_dict({
        "input_ids": [list(map(int, r)) for r in input_ids],
        "loss_mask": [list(map(int, m)) for m in loss_mask],
        "sample_id": list(sample_ids) if sample_ids else [f"s{i:03d}" for i in range(n)],
        "turn_index": [0] * n, "seq_len": [len(r) for r in input_ids], "truncated": [False] * n,
    }, features=features)
    prep = run_dir / "prepare"
    ds.save_to_disk(str(prep / "dataset"))
    write_manifest(prep, stage="prepare", config=PrepareStub(), clock=StageClock(),
                   counts={"rows_out": n},
                   extra={"verifier_vocab_size": 0, "tokenizer": {}, "chat_format": {},
                          "forced_token_ids": {}})
    return run_dir


def random_rows(lengths: Sequence[int], vocab: int, seed: int = 0
                ) -> tuple[list[list[int]], list[list[int]]]:
    """Random token rows; the first third of each row is prompt (mask 0), the rest mask 1."""
    rng = random.Random(seed)
    ids = [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
    masks = [[0] * (n // 3) + [1] * (n - n // 3) for n in lengths]
    return ids, masks
