"""Which embedding and head the drafter starts from: the verifier's as extract stored them, even
when this stage loaded the verifier in bf16 (found by ``bench_quality.py --train-dtype bfloat16``:
the drafter's frozen embedding came out bf16-rounded, max |diff| 0.0039 on SmolLM2, and export
refused it as "not the verifier's embedding")."""

from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from specdraft.artifacts.export import embed_problems
from specdraft.artifacts.hidden_states import HEAD_FILE
from specdraft.train.run import verifier_head


def _verifier(embed: torch.Tensor, lm_head: torch.Tensor):
    """A stand-in HF model: only the two accessors ``verifier_head`` reads."""
    e, h = torch.nn.Embedding(*embed.shape), torch.nn.Linear(embed.shape[1], embed.shape[0])
    e.weight.data, h.weight.data = embed, lm_head
    return SimpleNamespace(get_input_embeddings=lambda: e, get_output_embeddings=lambda: h)


def test_stored_head_wins_over_a_bf16_loaded_verifier(tmp_path):
    g = torch.Generator().manual_seed(0)
    embed, lm_head = torch.randn(50, 8, generator=g), torch.randn(50, 8, generator=g)
    (tmp_path / "extract").mkdir()
    save_file({"embed_tokens.weight": embed, "lm_head.weight": lm_head},
              str(tmp_path / "extract" / HEAD_FILE))
    bf16 = _verifier(embed.bfloat16(), lm_head.bfloat16())

    head = verifier_head(bf16, tmp_path)
    assert torch.equal(head["embed_tokens.weight"], embed)
    assert torch.equal(head["lm_head.weight"], lm_head)
    # what export checks: the copy made from the stored head passes, a bf16-rounded one fails
    config = SimpleNamespace(embed="auto")
    assert embed_problems(config, {"embed_tokens.weight": head["embed_tokens.weight"]},
                          embed) == []
    rounded = bf16.get_input_embeddings().weight.float()
    assert not torch.equal(rounded, embed)
    assert embed_problems(config, {"embed_tokens.weight": rounded}, embed) != []


def test_online_without_a_stored_head_reads_the_loaded_verifier(tmp_path):
    embed, lm_head = torch.ones(5, 4), torch.full((5, 4), 2.0)
    head = verifier_head(_verifier(embed, lm_head), tmp_path)
    assert torch.equal(head["embed_tokens.weight"], embed)
    assert torch.equal(head["lm_head.weight"], lm_head)
