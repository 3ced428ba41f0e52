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


@pytest.mark.slow
def test_batched_eval_equals_batch_1_on_smollm2(shared_data):
    """The real verifier (GGUF -> HF Llama, real rotary and chat template) on 4 GSM8K prompts of
    different lengths: batch 4 gives batch 1's tokens and per-step counts."""
    from specdraft.core.verifier import load_tokenizer, load_verifier
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.prompts import load_prompts

    from specdraft.eval.run import decode

    verifier = load_verifier("smollm2", dtype="float32")
    tok = load_tokenizer("smollm2")
    n = verifier.config.num_hidden_layers
    c = Eagle3Config.from_verifier(verifier.config, draft_vocab_size=verifier.config.vocab_size,
                                   aux_layer_ids=(2, n // 2, n - 3))
    torch.manual_seed(0)
    d = Eagle3DraftModel(c).eval()
    path = shared_data / "gsm8k" / "test.jsonl"
    ids = [tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True)
           for p in load_prompts(path, 4)]
    ids = [list(i["input_ids"] if hasattr(i, "keys") else i) for i in ids]
    assert len({len(i) for i in ids}) > 1
    cfg = dict(drafter=path, out=path.parent, prompts=path, k=3, max_new_tokens=8)
    one = decode(EvalConfig(**cfg), verifier, d, ids, [])
    four = decode(EvalConfig(**cfg, batch_size=4), verifier, d, ids, [])
    assert [g.tokens for g in four] == [g.tokens for g in one]
    assert [[(s.k, s.accepted) for s in g.stats.steps] for g in four] == \
        [[(s.k, s.accepted) for s in g.stats.steps] for g in one]
    assert all(len(g.tokens) == 8 for g in one)
