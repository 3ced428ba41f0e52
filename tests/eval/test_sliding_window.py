"""A sliding-window verifier decodes past its window: the offline loop rolls its cache back
after a rejection even once the window is full, and its output equals plain greedy decoding
without any cache. Window 4 here, so every step crosses it. Batched eval refuses it."""

import pytest
import torch
from greedy import greedy_reference
from test_specdec import OracleDrafter

from specdraft.core.errors import ConfigError
from specdraft.eval.batch import BatchVerifier
from specdraft.eval.specdec import EagleDrafter, VerifierSession, generate
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel

AUX = [1, 2, 3]
PROMPTS = [[2, 40, 17, 99, 5, 61, 8], [3, 11], [7, 7, 200, 31, 150]]


@pytest.fixture(scope="module")
def gemma():
    """A 4-layer random gemma3_text, sliding window 4 on layers 0-2, full attention on 3."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(5)
    cfg = Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, sliding_window=4, initializer_range=0.3,
                           layer_types=["sliding_attention"] * 3 + ["full_attention"])
    model = Gemma3ForCausalLM(cfg).eval()
    drafter = Eagle3DraftModel(Eagle3Config.from_verifier(cfg, draft_vocab_size=256,
                                                          aux_layer_ids=tuple(AUX))).eval()
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
    return model, drafter


@pytest.mark.parametrize("wrong", [False, True])
def test_oracle_drafter_past_the_window_equals_greedy(gemma, wrong):
    model, _ = gemma
    g = generate(VerifierSession(model, AUX), OracleDrafter(model, wrong=wrong), PROMPTS[0],
                 k=3, max_new_tokens=20)
    assert g.tokens == greedy_reference(model, PROMPTS[0], 20)
    assert g.stats.tau == (1.0 if wrong else 4.0)


def test_eagle_drafter_equals_greedy(gemma):
    """A random drafter: rejections at varied depths, each needing a cache roll-back."""
    model, drafter = gemma
    for p in PROMPTS:
        g = generate(VerifierSession(model, AUX), EagleDrafter(drafter), p, k=3,
                     max_new_tokens=16)
        assert g.tokens == greedy_reference(model, p, 16)
        assert g.stats.verify_steps > 1


def test_batched_eval_refuses_a_sliding_window_verifier(gemma):
    with pytest.raises(ConfigError, match="DynamicSlidingWindowLayer.*--batch-size 1"):
        BatchVerifier(gemma[0], AUX)
