"""Fixtures of the real-engine tests: vLLM's python, a tiny verifier vLLM's CPU attention
accepts (head_dim 32) that answers with varied tokens, and a drafter overfit with specdraft's own pipeline.

Engine starts are few (each 25-50 s here): the pipeline's eval stage runs vLLM once
(``eval.engine: vllm``), and :func:`engine_runs` runs every other drafter variant in ONE worker
process (one ``vllm.LLM`` after another).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from stubs import vllm_python_or_skip

sys.path.insert(0, str(Path(__file__).parent))
from engine_kit import K, MAX_TOKENS, QUESTIONS, TRAIN, make_chaotic_verifier, write_prompts  # noqa: E402

@pytest.fixture(scope="session")
def vllm_python() -> str:
    return vllm_python_or_skip()


@pytest.fixture(scope="session")
def engine_verifier(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    """The 8-layer random Llama of :func:`engine_kit.make_chaotic_verifier` (head_dim 32, weight
    std 0.3: varied answers) with the SmolLM2 tokenizer and chat template."""
    return make_chaotic_verifier(tmp_path_factory.mktemp("engine_verifier"),
                                 smollm2_tokenizer_dir)


@pytest.fixture(scope="session")
def overfit_run(tmp_path_factory, engine_verifier, vllm_python) -> Path:
    """``specdraft run`` end to end on the 6 prompts: generate (the verifier's greedy answers),
    prepare, vocab, extract, train (overfit), export (sglang) and eval with ``engine: vllm`` on
    the same prompts. Returns the run directory."""
    from specdraft.pipeline.config import PipelineConfig
    from specdraft.pipeline.run import run

    root = tmp_path_factory.mktemp("overfit")
    prompts = str(write_prompts(root / "prompts.jsonl", QUESTIONS))
    cfg = {"run_dir": str(root / "run"), "verifier": str(engine_verifier),
           "generate": {"prompts": prompts, "max_tokens": MAX_TOKENS, "batch_size": 6,
                        "keep_truncated": True, "dtype": "float32"},
           "prepare": {"max_seq_len": 256}, "vocab": {"draft_vocab_size": 512}, "extract": {},
           "train": {**TRAIN, "epochs": 1000, "ttt_steps": K, "warmup_steps": 2,
                     "val_fraction": 0.0, "eval_every": 1000, "save_every": 1000,
                     "batch_tokens": 1024, "dtype": "float32"},
           "export": {"format": "sglang"},
           "eval": {"prompts": prompts, "max_new_tokens": MAX_TOKENS, "k": K,
                    "dtype": "float32", "engine": "vllm", "engine_python": vllm_python}}
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    run(PipelineConfig.from_yaml(root / "config.yaml"))
    return root / "run"
