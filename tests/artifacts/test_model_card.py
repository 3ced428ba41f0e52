"""The model card written into exports (specdraft.artifacts.model_card): Hub-valid metadata read
back by huggingface_hub's own parser, and every figure equal to the run's manifests."""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import ModelCard

from specdraft.artifacts.model_card import card_facts, render_card, write_model_card

BASE = {"config_hash": "x", "argv": [], "started_at": "2026-12-04T00:00:00Z",
        "finished_at": "2026-12-04T00:01:00Z", "elapsed_s": 60.0}


def _manifest(run: Path, stage: str, **fields) -> None:
    (run / stage).mkdir(parents=True, exist_ok=True)
    body = {"stage": stage, "config": {}, **BASE, **fields}
    (run / stage / "manifest.json").write_text(json.dumps(body))


def _run(tmp_path: Path, *, with_eval: bool) -> Path:
    run = tmp_path / "run"
    _manifest(run, "generate", config={"prompts": "builtin:demo_train"},
              counts={"samples": 240},
              summary={"generated": 240, "with_reasoning": 60, "completion_tokens": 28534})
    _manifest(run, "prepare", verifier_vocab_size=49152, tokenizer={},
              chat_format={"template_sha256": "abc123"}, forced_token_ids={},
              summary={"tokenized": 240, "total_tokens": 40821, "supervised_tokens": 28534})
    _manifest(run, "extract", aux_layer_ids=[2, 15, 27], hidden_size=576, vocab_size=49152,
              storage={"format": "bf16"},
              verifier_identity={"config_sha256": "cfg9", "dtype": "float32",
                                 "weights": {"sha256": "w42"}, "tokenizer_sha256": "tok7"})
    _manifest(run, "train", config={"drafter": "eagle3", "epochs": 1, "ttt_steps": 4,
                                    "lr": 1e-4}, steps=126, best_step=120,
              best_val={"tau": 1.5524}, drafter_config={})
    if with_eval:
        _manifest(run, "eval", config={"prompts": "builtin:demo_eval", "k": 4,
                                       "temperature": 0.0, "max_new_tokens": 128,
                                       "dtype": "float32", "device": "cpu"},
                  counts={"prompts": 16}, tau=1.4741, per_position=[0.32, 0.11, 0.04, 0.01],
                  engine={"name": "vllm", "version": "0.32.0", "tau": 1.4768,
                          "per_position": [0.33, 0.1, 0.04, 0.01],
                          "engine_fixes": ["expand-kernel"]})
    return run


def test_card_metadata_parses_as_a_hub_model_card(tmp_path):
    run = _run(tmp_path, with_eval=True)
    facts = card_facts(run, kind="eagle3", fmt="sglang", verifier="smollm2",
                       base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
                       serve=["vllm serve X --speculative-config '{}'"])
    path = write_model_card(tmp_path, facts)
    card = ModelCard.load(path)  # huggingface_hub's own front-matter parser
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert card.data.library_name == "vllm"
    assert card.data.tags == ["speculative-decoding", "draft-model", "eagle3", "specdraft"]


def test_card_figures_are_the_manifests(tmp_path):
    run = _run(tmp_path, with_eval=True)
    text = render_card(card_facts(run, kind="eagle3", fmt="sglang", verifier="smollm2",
                                  base_model=None, serve=["vllm serve X"]))
    assert "base_model" not in text  # a local verifier has no Hub id: none invented
    assert "| samples with reasoning | 60 (25%) |" in text  # 60 of 240, by hand
    assert "| tokens (supervised) | 40821 (28534) |" in text
    assert "| aux layer ids (HF hidden_states indices) | [2, 15, 27] |" in text
    assert "| best validation τ̂ (step) | 1.552 (120) |" in text
    assert "| weights fingerprint | w42 |" in text
    assert "**τ 1.474**" in text and "[0.320, 0.110, 0.040, 0.010]" in text
    assert "16 prompts of `builtin:demo_eval`, k = 4, temperature 0.0" in text
    assert "**τ 1.477**" in text and "fix(es) to the engine: expand-kernel" in text
    assert "vllm serve X" in text
    assert "Measured at temperature 0.0, k = 4" in text


def test_card_before_eval_says_not_measured(tmp_path):
    run = _run(tmp_path, with_eval=False)
    text = render_card(card_facts(run, kind="dflash", fmt="vllm", verifier="/m/v",
                                  base_model=None, serve=[]))
    assert "Not yet measured." in text and "τ 1." not in text.split("## Acceptance")[1]
    assert "not yet evaluated: run `specdraft eval`" in text
    assert ModelCard(text).data.tags[2] == "dflash"
