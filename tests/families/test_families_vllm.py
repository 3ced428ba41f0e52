"""A family's export served by the real vLLM (CPU build, ``.venv-vllm``) once: ``specdraft run``
(generate: the verifier's own greedy answers to 4 prompts; train: 30 steps, enough to memorise
them) with ``eval.engine: vllm`` runs vLLM with the tiny verifier and the exported drafter on the
same prompt ids beside the offline loop; at float32 the two must commit the same tokens (eval
fails beyond ``--engine-tolerance`` otherwise) and vLLM's acceptance counters, non-zero, must be
the offline ones.

vLLM's CPU attention needs ``head_dim`` >= 32, so this verifier uses 2 heads of 32. One family
is served (one engine start fits the test budget): Qwen3-MoE. vLLM 0.32 cannot run an EAGLE-3
drafter on gemma3 or phi3 (no ``SupportsEagle3`` aux capture in
``vllm/model_executor/models/gemma3.py``, ``phi3.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from stubs import vllm_python_or_skip

sys.path.insert(0, str(Path(__file__).parent))
from test_families import save_verifier  # noqa: E402

QUESTIONS = ["What is 2+2?", "Name a colour.", "Say hello.", "Count to five."]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", ["qwen3_moe"])
def test_vllm_serves_the_export_as_offline_eval(family, tmp_path, smollm2_tokenizer_dir):
    from specdraft.pipeline.config import PipelineConfig
    from specdraft.pipeline.run import run

    python = vllm_python_or_skip()
    verifier = save_verifier(tmp_path / "verifier", family, smollm2_tokenizer_dir,
                             head_dim=32, num_attention_heads=2, num_key_value_heads=1)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "question": q}) + "\n"
                               for i, q in enumerate(QUESTIONS)))
    cfg = {"run_dir": str(tmp_path / "run"), "verifier": str(verifier),
           "generate": {"prompts": str(prompts), "max_tokens": 16, "batch_size": 4,
                        "keep_truncated": True, "dtype": "float32"},
           "prepare": {"max_seq_len": 256},
           "vocab": {"draft_vocab_size": 256}, "extract": {"storage": "fp32"},
           "train": {"max_steps": 30, "epochs": 1000, "lr": 1e-2, "ttt_steps": 2,
                     "warmup_steps": 2, "val_fraction": 0.0, "eval_every": 1000,
                     "save_every": 1000, "batch_tokens": 1024, "dtype": "float32"},
           "export": {"format": "sglang"},
           "eval": {"prompts": str(prompts), "max_new_tokens": 16, "k": 2,
                    "dtype": "float32", "engine": "vllm", "engine_python": python}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    run(PipelineConfig.from_yaml(tmp_path / "run.yaml"))
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    engine = results["engine"]
    assert engine["name"] == "vllm" and engine["dtype"] == "float32"
    agreement = engine["agreement"]
    assert agreement["counts_identical"] and agreement["identical_prompts"] == 4
    assert engine["verify_steps"] == results["verify_steps"]
    assert engine["accepted"] == sum(p["accepted"] for p in results["prompts"]) > 0
    assert [p["tokens"] for p in engine["prompts"]] == [p["tokens"] for p in results["prompts"]]
