"""`specdraft eval` with the real SmolLM2 GGUF verifier and real GSM8K prompts (slow)."""

import json

import pytest
import torch

from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel
from specdraft.models.io import save_drafter


@pytest.mark.slow
def test_eval_smollm2_gsm8k(tmp_path, shared_data):
    from specdraft.core.verifier import load_verifier
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import run

    verifier = load_verifier("smollm2", dtype="float32")
    n = verifier.config.num_hidden_layers
    c = Eagle3Config.from_verifier(verifier.config, draft_vocab_size=verifier.config.vocab_size,
                                   aux_layer_ids=(2, n // 2, n - 3))
    torch.manual_seed(0)
    d = Eagle3DraftModel(c)
    save_drafter(d, tmp_path / "drafter")
    run(EvalConfig(drafter=tmp_path / "drafter", out=tmp_path / "out", verifier="smollm2",
                   prompts=shared_data / "gsm8k" / "test.jsonl", limit=1, k=3,
                   max_new_tokens=8), verifier=verifier)
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["aux_layer_ids"] == [2, 15, 27] and len(res["per_position"]) == 3
    p = res["prompts"][0]
    assert p["new_tokens"] == 8 and p["prompt_tokens"] > 20
    assert 1.0 <= res["tau"] <= 4.0
