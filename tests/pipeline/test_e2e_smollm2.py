"""The whole job on the real SmolLM2-135M-Instruct GGUF with tiny sizes (issue: specdraft run):
every stage's artifacts and manifest, the export's validation, doctor, and a real offline tau."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from specdraft.pipeline.config import PipelineConfig
from specdraft.pipeline.run import run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo-smollm2.yaml"


def tiny_demo(tmp_path: Path) -> Path:
    """The shipped demo config with tiny sizes: 16 prompts, short answers, a short epoch."""
    cfg = yaml.safe_load(DEMO.read_text())
    cfg["run_dir"] = str(tmp_path / "run")
    cfg["generate"].update(limit=16, max_tokens=48, keep_truncated=True)
    cfg["vocab"]["draft_vocab_size"] = 1024
    cfg["train"].update(epochs=1, ttt_steps=3, eval_every=4, save_every=4, val_fraction=0.25)
    cfg["eval"].update(limit=4, max_new_tokens=24, engine="none")  # vLLM: tests/engine
    path = tmp_path / "demo-tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_demo_pipeline_on_the_real_gguf(tmp_path):
    config = PipelineConfig.from_yaml(tiny_demo(tmp_path))
    manifest = run(config)
    rd = Path(config.run_dir)
    assert set(manifest["actions"].values()) == {"ran"}
    m = {s: json.loads((rd / s / "manifest.json").read_text()) for s in manifest["actions"]}

    assert m["generate"]["summary"]["generated"] == 16
    assert m["prepare"]["summary"]["tokenized"] == 16
    assert m["prepare"]["chat_format"]["stop_tokens"] == ["<|im_end|>"]
    maps = load_file(str(rd / "vocab" / "vocab_map.safetensors"))
    assert maps["d2t"].shape == (1024,) and int(maps["t2d"].sum()) == 1024
    assert m["extract"]["aux_layer_ids"] == [2, 15, 27] and m["extract"]["n_layers"] == 30
    assert (rd / "train" / "best" / "drafter.safetensors").exists()

    out = Path(m["export"]["out"])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]          # vLLM: input to layer i
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]  # SGLang
    assert (cfg["draft_vocab_size"], cfg["vocab_size"], cfg["max_position_embeddings"]) == \
        (1024, 49152, 8192)
    weights = load_file(str(out / "model.safetensors"))
    assert weights["fc.weight"].shape == (576, 3 * 576)
    assert torch.equal(weights["d2t"], maps["d2t"])
    head = load_file(str(rd / "extract" / "verifier_head.safetensors"))
    if "embed_tokens.weight" in weights:
        assert torch.equal(weights["embed_tokens.weight"].float(),
                           head["embed_tokens.weight"].float())

    assert m["eval"]["counts"]["prompts"] == 4
    assert m["eval"]["tau"] >= 1.0 and len(m["eval"]["per_position"]) == 4
    assert (rd / "eval" / "acceptance.png").exists()
    assert "Serve the drafter" in (rd / "run" / "summary.txt").read_text()

    from specdraft.doctor.config import DoctorConfig
    from specdraft.doctor.run import run as doctor

    report = doctor(DoctorConfig(target=rd, verifier="smollm2"))
    assert report["ok"], [c for c in report["checks"] if not c["ok"]]
