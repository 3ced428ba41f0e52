"""``specdraft train`` with the EAGLE-3.1 norms and the Qwen3 layer (docs/drafters.md): the
drafter learns, its new norms are trained, and the saved drafter carries the fields."""

import json

import pytest
import torch
from safetensors.torch import load_file

from specdraft.train.config import TrainConfig
from specdraft.train.run import run


@pytest.mark.slow
def test_eagle31_qwen3_drafter_trains_and_saves_its_fields(run_dir, verifier, source):
    cfg = TrainConfig(run_dir=run_dir, epochs=1000, max_steps=80, ttt_steps=3, lr=3e-3,
                      warmup_steps=10, batch_tokens=36 * 4, val_fraction=0.2, eval_every=40,
                      save_every=40, log_every=10, norm_before_fc=True, fc_norm=True,
                      norm_output=True, drafter_layer="qwen3")
    run(cfg, verifier=verifier, source=source)
    train = [r for r in map(json.loads, (run_dir / "train" / "metrics.jsonl").read_text()
                            .splitlines()) if r["split"] == "train"]
    assert train[-1]["loss"] < 0.6 * train[0]["loss"]
    best = run_dir / "train" / "best"
    config = json.loads((best / "drafter_config.json").read_text())
    assert (config["norm_before_fc"], config["fc_norm"], config["norm_output"],
            config["draft_layer"]) == (True, True, True, "qwen3")
    w = load_file(str(best / "drafter.safetensors"))
    for name in ("input_norm.weight", "fc_norm.0.weight", "midlayer.self_attn.q_norm.weight",
                 "midlayer.self_attn.k_norm.weight"):
        assert not torch.equal(w[name], torch.ones_like(w[name])), f"{name} never trained"


def test_drafter_layer_auto_follows_the_family_rule(run_dir, verifier, source):
    """The tiny verifier is a Llama: ``auto`` gives the Llama layer (DRAFT_LAYER_BY_FAMILY)."""
    run(TrainConfig(run_dir=run_dir, max_steps=1, ttt_steps=1, batch_tokens=36 * 4,
                    val_fraction=0.2, drafter_layer="auto"), verifier=verifier, source=source)
    config = json.loads((run_dir / "train" / "last" / "drafter_config.json").read_text())
    assert config["draft_layer"] == "llama"
