"""``train --drafter-layer mla`` on the Kimi-K2.5-shaped verifier (``tests/kimi_fixture.py``, built in
memory at vocab 1024): the MLA drafter is built from the verifier's MLA widths, overfits the
verifier's own greedy continuations, and its train/best reloads as the MLA drafter."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from specdraft.models.eagle3_mla import Eagle3MLADraftModel
from specdraft.artifacts.drafter import load_drafter
from specdraft.train.config import TrainConfig
from specdraft.train.run import run

from memsource import MemorySource, greedy_corpus, write_vocab

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kimi_fixture import kimi_config  # noqa: E402

VOCAB = 1024


@pytest.fixture(scope="module")
def kimi():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(kimi_config(VOCAB)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # a peaked teacher
    corpus = greedy_corpus(model, 8, vocab_range=VOCAB)
    return model, corpus, MemorySource(model, corpus)


@pytest.mark.slow
def test_mla_drafter_trains_and_reloads(tmp_path, kimi):
    model, corpus, source = kimi
    write_vocab(tmp_path, corpus, VOCAB)
    cfg = TrainConfig(run_dir=tmp_path, drafter_layer="mla", epochs=200, max_steps=30, ttt_steps=2,
                      lr=1e-2, warmup_steps=2, batch_tokens=36 * 8, val_fraction=0.0,
                      eval_every=1000, save_every=1000, log_every=1, dtype="float32",
                      teacher_check=False)
    run(cfg, verifier=model, source=source)
    drafter = load_drafter(tmp_path / "train" / "last")
    assert isinstance(drafter, Eagle3MLADraftModel)
    c = json.loads((tmp_path / "train" / "last" / "drafter_config.json").read_text())
    assert c["draft_layer"] == "mla"
    assert (c["kv_lora_rank"], c["qk_rope_head_dim"], c["head_dim"], c["v_head_dim"]) == \
        (512, 64, 96, 32)
    assert "midlayer.self_attn.kv_b_proj.weight" in drafter.state_dict()
    log = [json.loads(x) for x in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r and r.get("split", "train") == "train"]
    assert losses[-1] < 0.5 * losses[0], losses
    # the reader every later stage uses (export, eval --drafter, doctor) reads it as the MLA layer
    from specdraft.artifacts.drafter import read_drafter

    assert read_drafter(tmp_path / "train" / "last").config == drafter.config
