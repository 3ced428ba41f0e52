"""The capture convention, checked on a hand-made toy model and against transformers itself."""

from __future__ import annotations

import pytest
import torch

from specdraft.core.errors import ConfigError
from specdraft.core.batching import pad_rows
from specdraft.core.capture import capture, check_aux_ids, default_aux_ids


class AddConstant(torch.nn.Module):
    """A decoder layer that adds ``c`` to every value (signature of transformers' layers)."""

    def __init__(self, c: float) -> None:
        super().__init__()
        self.c = c

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states + self.c


def toy_model(n_layers: int = 6, hidden: int = 8):
    """A Llama whose embedding outputs 0 and whose layer i adds 10**i."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32, hidden_size=hidden, intermediate_size=16,
                      num_hidden_layers=n_layers, num_attention_heads=2, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg).eval()
    torch.nn.init.zeros_(model.model.embed_tokens.weight)
    model.model.layers = torch.nn.ModuleList(AddConstant(10.0 ** i) for i in range(n_layers))
    return model


def test_toy_prefix_sums():
    model = toy_model()
    p = pad_rows([[1, 2, 3, 4], [5, 6]], [[0, 0, 1, 1], [0, 1]])
    aux, final = capture(model, p.input_ids, p.attention_mask, p.position_ids, [1, 3, 5])
    assert aux.shape == (2, 4, 3, 8)
    # id i = input to layer i = sum of 10**j for j < i
    for g, expected in enumerate([1.0, 111.0, 11111.0]):
        assert torch.equal(aux[0, :, g], torch.full((4, 8), expected))
        assert torch.equal(aux[1, :2, g], torch.full((2, 8), expected))
    # id N (= 6) is the final hidden state: RMSNorm of the constant 111111 with unit weight = 1
    aux6, final6 = capture(model, p.input_ids, p.attention_mask, p.position_ids, [6])
    assert torch.allclose(final6[0], torch.ones(4, 8), atol=1e-6)
    assert torch.equal(aux6[:, :, 0], final6)


def test_ids_refused_outside_range():
    assert check_aux_ids([1, 3, 5], 6) == (1, 3, 5)
    # id N = 6 is after the final norm in HF, before it in the engines: refused
    for bad in ([0], [6], [7], [2, 2], [], [3, 1]):
        with pytest.raises(ConfigError, match="--aux-layers"):
            check_aux_ids(bad, 6)
    assert default_aux_ids(30) == (2, 15, 27)
    assert default_aux_ids(7) == (2, 3, 4)
    assert default_aux_ids(6) == (2, 3, 5)
    assert default_aux_ids(4) == (1, 2, 3)


def test_matches_hf_hidden_states_and_logits(tiny_model):
    """Hooks give HF's hidden_states[i] for every i in [1, N]; lm_head(final) == logits."""
    torch.manual_seed(1)
    ids = torch.randint(0, 1000, (2, 9))
    p = pad_rows(ids.tolist(), [[1] * 9] * 2)
    n = tiny_model.config.num_hidden_layers
    aux, final = capture(tiny_model, p.input_ids, p.attention_mask, p.position_ids,
                         list(range(1, n + 1)))
    with torch.no_grad():
        out = tiny_model(input_ids=ids, output_hidden_states=True)
    for i in range(1, n + 1):
        assert torch.allclose(aux[:, :, i - 1], out.hidden_states[i], atol=1e-6), i
    assert torch.allclose(final, out.hidden_states[n], atol=1e-6)
    logits = tiny_model.lm_head(final)
    assert (logits - out.logits).abs().max() < 1e-5
    # the final norm matters: the last layer's raw output would not give the logits
    grabbed = []
    handle = tiny_model.model.norm.register_forward_pre_hook(lambda m, a: grabbed.append(a[0]))
    with torch.no_grad():
        tiny_model(input_ids=ids)
    handle.remove()
    assert (tiny_model.lm_head(grabbed[0]) - out.logits).abs().max() > 1e-2
