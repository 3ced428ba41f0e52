"""Batched offline decoding against the batch-1 loop and the real vLLM engine (slow): the
overfit drafter of ``specdraft run`` (tests/engine/conftest.py), whose counts the engine matches
exactly, decoded 4 prompts per verifier forward gives the same counts and tokens."""

from __future__ import annotations

import json

import pytest
import torch

from engine_kit import K, MAX_TOKENS, QUESTIONS

pytestmark = pytest.mark.slow

COUNTS = ("verify_steps", "drafted", "accepted", "per_position_accepted")


def test_batched_offline_counts_equal_batch_1_and_vllm(overfit_run, engine_verifier, tmp_path):
    from specdraft.core.verifier import load_verifier
    from specdraft.eval.acceptance import AcceptanceStats
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import decode, load_drafter_model

    results = json.loads((overfit_run / "eval" / "results.json").read_text())
    job = json.loads((overfit_run / "eval" / "engine-job.json").read_text())
    cfg = EvalConfig(drafter=results["drafter"], out=tmp_path, prompts=tmp_path / "unused",
                     verifier=str(engine_verifier), k=K, max_new_tokens=MAX_TOKENS,
                     dtype="float32", batch_size=4)
    verifier = load_verifier(engine_verifier, dtype="float32")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: 1 thread is far faster on shared, loaded cores
    try:
        gens = decode(cfg, verifier, load_drafter_model(cfg, verifier), job["prompts"],
                      job["stop_token_ids"])
    finally:
        torch.set_num_threads(threads)
    stats = AcceptanceStats()
    for g in gens:
        stats.extend(g.stats)
    got = stats.summary()
    assert results["accepted"] > results["verify_steps"]  # a drafter that is mostly accepted
    for name in COUNTS:
        assert got[name] == results[name] == results["engine"][name], name
    assert len(gens) == len(QUESTIONS)
    for g, off, eng in zip(gens, results["prompts"], results["engine"]["prompts"]):
        assert g.tokens == off["tokens"] == eng["tokens"]
