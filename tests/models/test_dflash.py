"""The DFlash drafter (specdraft.models.dflash), its training objective and its vLLM export, on a
tiny random Qwen3 verifier. The engine itself is in tests/engine/test_dflash_vllm.py (slow)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

K = 3


@pytest.fixture(scope="module")
def verifier():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      max_position_embeddings=256, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return Qwen3ForCausalLM(cfg).eval()


def drafter(verifier, **overrides):
    from specdraft.models.dflash import DFlashConfig, DFlashDraftModel

    torch.manual_seed(1)
    fields = {"target_layer_ids": (0, 2), "mask_token_id": 7, **overrides}
    c = DFlashConfig.from_verifier(verifier.config, block_size=K + 1, num_hidden_layers=2,
                                   **fields)
    m = DFlashDraftModel(c)
    m.set_verifier_tables(verifier)
    return m.eval()


def test_block_mask_by_hand():
    """Two blocks of 2 slots over a 4-column context, anchors 1 and 3."""
    from specdraft.models.dflash import block_mask

    m = block_mask(torch.tensor([[1, 3]]), T=4, Q=2)[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 1, 1, 0, 0],
                 [1, 0, 0, 0, 1, 1, 0, 0],
                 [1, 1, 1, 0, 0, 0, 1, 1],
                 [1, 1, 1, 0, 0, 0, 1, 1]]
    causal = block_mask(torch.tensor([[1, 3]]), T=4, Q=2, causal=True)[0, 0].int().tolist()
    assert causal[0][4:] == [1, 0, 0, 0] and causal[3][4:] == [0, 0, 1, 1]


def test_config_refuses_what_vllm_reads_otherwise(verifier):
    from specdraft.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"target_layer_ids \[0, 3\] must increase strictly "
                                          r"inside \[0, 2\]"):
        drafter(verifier, target_layer_ids=(0, 3))  # id N-1: HF post-norm, vLLM pre-norm
    with pytest.raises(ConfigError, match="mask_token_id 999 not in the vocabulary"):
        drafter(verifier, mask_token_id=999)
    assert drafter(verifier).config.hf_hidden_ids() == [1, 3]  # layer-output ids + 1


def test_training_blocks_equal_one_block_per_forward(verifier):
    """The training forward (several blocks, full context, mask) gives each block what the eval
    path (:func:`draft_block`: one block, context cut at the anchor) gives: one forward, two
    uses. Changing a context state at or after the anchor changes nothing, before it does."""
    from specdraft.models.dflash import draft_block

    m = drafter(verifier)
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(1, 12, 64, generator=g)
    anchors = torch.tensor([[4, 9]])
    ids = torch.tensor([[[11] + [7] * K, [13] + [7] * K]])
    with torch.no_grad():
        out = m(hidden, ids, anchors)  # [1, 2, K+1, H]
        for b, (a, tok) in enumerate([(4, 11), (9, 13)]):
            want = m.lm_head(out[0, b, 1:]).argmax(-1)
            assert torch.equal(draft_block(m, hidden[0, :a], tok, K), want)
            one = m(hidden[:, :a], ids[:, b:b + 1], torch.tensor([[a]]))[0, 0]
            torch.testing.assert_close(one, out[0, b], rtol=1e-5, atol=1e-5)
        first = m(hidden, ids[:, :1], anchors[:, :1])
        later, earlier = hidden.clone(), hidden.clone()
        later[0, 4:] += 1.0
        earlier[0, 3] += 1.0
        assert torch.equal(m(later, ids[:, :1], anchors[:, :1]), first)
        assert not torch.allclose(m(earlier, ids[:, :1], anchors[:, :1]), first)


def test_block_is_bidirectional_unless_causal(verifier):
    """Slot 1 sees slot 3 (bidirectional); with ``causal`` it does not: changing the token in
    slot 3 moves slot 1's state only in the first case."""
    hidden = torch.randn(1, 6, 64, generator=torch.Generator().manual_seed(4))
    a = torch.tensor([[6]])
    ids = torch.tensor([[[11, 7, 7, 7]]])
    other = torch.tensor([[[11, 7, 7, 20]]])
    with torch.no_grad():
        for causal, moved in ((False, True), (True, False)):
            m = drafter(verifier, causal=causal)
            d = (m(hidden, ids, a) - m(hidden, other, a))[0, 0, 1].abs().max()
            assert (d > 1e-4) == moved, (causal, float(d))


def test_objective_by_hand():
    from specdraft.train.dflash_objective import IGNORE, block_batch, position_weights

    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 0]])
    blocks, targets = block_batch(ids, mask, torch.tensor([[1, 4]]), block_size=4,
                                  mask_token_id=7)
    assert blocks.tolist() == [[[11, 7, 7, 7], [14, 7, 7, 7]]]
    assert targets.tolist() == [[[12, 13, 14], [IGNORE, IGNORE, IGNORE]]]
    torch.testing.assert_close(position_weights(4, 2.0),
                               torch.tensor([1.0, 0.60653066, 0.36787944]))


def test_overfit_loss_falls(verifier):
    """A few steps on one batch: slot accuracy goes from 0 to ~1 (measured 0.94 / 0.92 / 1.0) and
    the loss falls (4.85 -> 4.16: the verifier's random head gives flat logits, so the loss
    stays near log V); the verifier's tables are left alone."""
    from specdraft.train.dflash_objective import overfit

    m = drafter(verifier)
    embed = m.embed_tokens.weight.clone()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(10, 128, (2, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[:, :4] = 0
    with torch.no_grad():
        hs = verifier(input_ids=ids, output_hidden_states=True).hidden_states
    hidden = torch.cat([hs[i] for i in m.config.hf_hidden_ids()], -1)
    log = overfit(m, hidden, ids, mask, steps=30, lr=1e-2)
    assert log[-1]["loss"] < log[0]["loss"] - 0.4, (log[0], log[-1])
    assert log[0]["acc_1"] < 0.1 and log[-1]["acc_1"] > 0.8, (log[0], log[-1])
    assert torch.equal(m.embed_tokens.weight, embed)


def test_export_round_trip(verifier, tmp_path):
    from specdraft.artifacts.dflash_export import ARCH, load_dflash, read_dflash
    from specdraft.models.dflash import draft_block

    m = drafter(verifier)
    from specdraft.artifacts.dflash_export import export_dflash

    export_dflash(m, tmp_path / "x")
    cfg = json.loads((tmp_path / "x" / "config.json").read_text())
    assert cfg["architectures"] == [ARCH] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {"mask_token_id": 7, "target_layer_ids": [0, 2],
                                    "causal": False, "sample_from_anchor": False}
    assert cfg["block_size"] == K + 1
    assert "eagle_aux_hidden_state_layer_ids" not in cfg
    config, tensors = read_dflash(tmp_path / "x")
    assert dataclasses.replace(config, verifier_profile=None) == \
        dataclasses.replace(m.config, verifier_profile=None)
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in tensors)
    back = load_dflash(tmp_path / "x", verifier)
    hidden = torch.randn(9, 64, generator=torch.Generator().manual_seed(6))
    assert torch.equal(draft_block(back, hidden, 11, K), draft_block(m, hidden, 11, K))


@pytest.mark.parametrize("edit, named", [
    (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 3]),
     "eagle_aux_hidden_state_layer_ids=[1, 3]"),
    (lambda c: c["dflash_config"].update(use_swa=True), "dflash_config.use_swa=True"),
    (lambda c: c.update(is_neox_style=False), "is_neox_style=False"),
    (lambda c: c.update(layer_types=["sliding_attention", "full_attention"]), "layer_types="),
    (lambda c: c["dflash_config"].update(sample_from_anchor=True),
     "dflash_config.sample_from_anchor=True"),
])
def test_read_refuses_what_specdraft_does_not_compute(verifier, tmp_path, edit, named):
    from specdraft.artifacts.dflash_export import export_dflash, read_dflash
    from specdraft.core.errors import InputError

    export_dflash(drafter(verifier), tmp_path / "x")
    path = tmp_path / "x" / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="config.json: not a DFlash drafter") as err:
        read_dflash(tmp_path / "x")
    assert named in str(err.value)


def test_a_config_without_block_size_is_refused_naming_file_and_field(verifier, tmp_path):
    """vLLM does not read block_size, so nothing may stand in for it: a config without it is
    refused on read (it was read as 2 and re-exported as 2), naming the file and the field; the
    export writes it (and sample_from_anchor: false) explicitly, and false reads back."""
    from specdraft.artifacts.dflash_export import export_dflash, read_dflash
    from specdraft.core.errors import InputError

    export_dflash(drafter(verifier), tmp_path / "x")
    path = tmp_path / "x" / "config.json"
    cfg = json.loads(path.read_text())
    assert read_dflash(tmp_path / "x")[0].block_size == K + 1 == cfg["block_size"]
    del cfg["block_size"]
    path.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=r"x/config.json: missing key .block_size") as err:
        read_dflash(tmp_path / "x")
    assert "num_speculative_tokens + 1" in str(err.value)


def test_export_refuses_a_non_finite_tensor(verifier, tmp_path):
    from specdraft.artifacts.dflash_export import DFlashExportRefused, export_dflash

    m = drafter(verifier)
    with torch.no_grad():
        m.layers[1].self_attn.k_norm.weight[0] = float("nan")
    with pytest.raises(DFlashExportRefused, match=r"layers\.1\.self_attn\.k_norm\.weight: not "
                                                  r"finite"):
        export_dflash(m, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_drafter_reader_reads_a_dflash_export_and_doctor_checks_it(verifier, tmp_path,
                                                                   smollm2_tokenizer_dir):
    """eval / export read drafters with ``artifacts.drafter.read_drafter``: a DFlash export is
    read as vLLM reads it (format ``dflash``) and built with the verifier's tables into the
    drafter that was exported (same blocks drafted); the doctor runs every check a DFlash
    drafter takes (the draft-vocabulary and EAGLE-3 computation-field checks say NOT RUN), and a
    planted short max_position_embeddings fails its check."""
    import shutil

    from specdraft.artifacts.checks import check_drafter
    from specdraft.artifacts.dflash_export import export_dflash
    from specdraft.artifacts.drafter import build_model, read_drafter
    from specdraft.core.errors import InputError
    from specdraft.models.dflash import draft_block

    m = drafter(verifier)
    export_dflash(m, tmp_path / "x")
    d = read_drafter(tmp_path / "x")
    assert d.format == "dflash" and d.config == m.config.__class__.from_dict(
        {**m.config.to_dict(), "verifier_profile": None})
    with pytest.raises(InputError, match="no lm_head.weight"):
        build_model(d, verifier_embed=verifier.get_input_embeddings().weight)
    back = build_model(d, verifier_embed=verifier.get_input_embeddings().weight,
                       verifier_head=verifier.get_output_embeddings().weight)
    feats = torch.randn(9, m.config.n_target * m.config.target_hidden_size)
    assert torch.equal(draft_block(back, feats, 17, 4), draft_block(m, feats, 17, 4))
    verifier.save_pretrained(tmp_path / "v")
    for f in Path(smollm2_tokenizer_dir).iterdir():
        shutil.copy(f, tmp_path / "v" / f.name)
    report = check_drafter(tmp_path / "x", str(tmp_path / "v"), verifier=verifier)
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert report["ok"] and report["format"] == "dflash", report["checks"]
    assert [n for n, s in status.items() if s == "not run"][:2] == ["vocab",
                                                                     "computation fields"]
    assert status["tensors are the ones the config describes"] == "pass"
    assert status["aux ids present, right convention per engine"] == "pass"
    cfg = json.loads((tmp_path / "x" / "config.json").read_text())
    cfg["max_position_embeddings"] = 64  # planted: shorter than the verifier's 256
    (tmp_path / "x" / "config.json").write_text(json.dumps(cfg))
    bad = check_drafter(tmp_path / "x", str(tmp_path / "v"), verifier=verifier)
    failed = {c["name"]: c["detail"] for c in bad["checks"] if c["status"] == "fail"}
    assert failed == {"max_position_embeddings >= the verifier's": "drafter 64, verifier 256"}


def test_batched_offline_decode_equals_batch_1(verifier):
    """``eval --batch-size 3`` with a DFlash drafter (:class:`BatchDFlashDrafter`, rows of
    different lengths in one block forward) commits the same tokens and counts the same
    acceptances as one prompt at a time, on a drafter trained to accept some drafts."""
    from specdraft.eval.batch import BatchVerifier, generate_batch
    from specdraft.eval.dflash import BatchDFlashDrafter, DFlashDrafter
    from specdraft.eval.specdec import VerifierSession, generate
    from specdraft.train.dflash_objective import overfit

    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(8, 128, (n,), generator=g).tolist() for n in (5, 9, 7, 6)]
    m = drafter(verifier)
    with torch.no_grad():  # the verifier's greedy answers to the same-length prompts 0 and 3
        rows = verifier.generate(torch.tensor([prompts[0][:5], prompts[3][:5]]),
                                 do_sample=False, max_new_tokens=16, min_new_tokens=16,
                                 attention_mask=torch.ones(2, 5, dtype=torch.long),
                                 pad_token_id=0)
        states = torch.cat([verifier(rows, output_hidden_states=True).hidden_states[i]
                            for i in m.config.hf_hidden_ids()], -1)
    mask = torch.zeros_like(rows)
    mask[:, 5:] = 1
    overfit(m, states, rows, mask, steps=40)
    ids = m.config.hf_hidden_ids()
    one = [generate(VerifierSession(verifier, ids), DFlashDrafter(m), p, k=K,
                    max_new_tokens=16) for p in prompts]
    many = generate_batch(BatchVerifier(verifier, ids), BatchDFlashDrafter(m), prompts,
                          batch_size=3, k=K, max_new_tokens=16)
    assert sum(g.stats.accepted for g in one) > 0
    for a, b in zip(one, many):
        assert a.tokens == b.tokens
        assert [s.accepted for s in a.stats.steps] == [s.accepted for s in b.stats.steps]
