"""``specdraft train --drafter dflash`` (docs/drafters.md "DFlash"): the drafter learns the
memorised corpus, is saved as a self-contained specdraft drafter that reads the run's aux layers
(``target_layer_ids = aux ids - 1``), resumes exactly, and the settings of one drafter kind are
refused for the other. The objective's counts are checked by hand."""

import json

import pytest
import torch
from safetensors.torch import load_file

from specdraft.core.errors import ConfigError
from specdraft.train.config import TrainConfig
from specdraft.train.run import run

BLOCK = 4


def cfg(run_dir, **kw):
    base = dict(run_dir=run_dir, epochs=1000, max_steps=60, lr=3e-3, warmup_steps=5,
                batch_tokens=36 * 4, val_fraction=0.2, eval_every=30, save_every=30,
                log_every=10, drafter="dflash", dflash_block_size=BLOCK, dflash_anchors=8)
    return TrainConfig(**{**base, **kw})


def records(run_dir, split):
    return [r for r in map(json.loads, (run_dir / "train" / "metrics.jsonl").read_text()
                           .splitlines()) if r["split"] == split]


def test_dflash_trains_and_saves_a_self_contained_drafter(run_dir, verifier, source):
    from specdraft.models.dflash import DFlashDraftModel
    from specdraft.artifacts.drafter import load_drafter

    run(cfg(run_dir), verifier=verifier, source=source)
    train = records(run_dir, "train")
    assert train[-1]["loss"] < 0.5 * train[0]["loss"]
    assert train[-1]["tau"] > train[0]["tau"] + 0.3  # greedy block acceptance (chain counts)
    assert len(train[-1]["cond_acc"]) == BLOCK - 1  # one "step" per mask slot
    config = json.loads((run_dir / "train" / "best" / "drafter_config.json").read_text())
    assert tuple(source.aux_layer_ids) == (1, 2, 3)
    assert (config["target_layer_ids"], config["block_size"], config["causal"],
            config["mask_token_id"]) == ([0, 1, 2], BLOCK, False, 1023)  # vocab 1024 - 1
    model = load_drafter(run_dir / "train" / "last")
    assert isinstance(model, DFlashDraftModel)
    assert torch.equal(model.embed_tokens.weight, verifier.get_input_embeddings().weight)
    assert torch.equal(model.lm_head.weight, verifier.get_output_embeddings().weight)
    w = load_file(str(run_dir / "train" / "last" / "drafter.safetensors"))
    assert not torch.equal(w["hidden_norm.weight"], torch.ones_like(w["hidden_norm.weight"]))


def test_dflash_resumes_exactly(tmp_path, corpus, verifier, source, monkeypatch):
    """Uninterrupted 12 steps == a crash after step 6 (checkpoint at 4) + --resume: the
    anchors are drawn from the step and the row (DFlashObjective.row_generator)."""
    from memsource import crash_then_resume, write_vocab

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        write_vocab(d, corpus, 1024)
    kw = dict(max_steps=12, save_every=4, eval_every=4, log_every=1)
    assert crash_then_resume(run, cfg, a, b, kw, verifier=verifier, source=source,
                             monkeypatch=monkeypatch)["resumed"]
    wa = load_file(str(a / "train" / "last" / "drafter.safetensors"))
    wb = load_file(str(b / "train" / "last" / "drafter.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert [r["loss"] for r in records(a, "train")] == [r["loss"] for r in records(b, "train")]


@pytest.mark.parametrize("given, flag", [
    (dict(drafter="dflash", ttt_steps=3), "--ttt-steps"),
    (dict(drafter="dflash", norm_output=True), "--norm-output"),
    (dict(dflash_layers=3), "--dflash-layers"),
    (dict(drafter="eagle3", dflash_block_size=6), "--dflash-block-size")])
def test_a_setting_of_the_other_drafter_is_refused(tmp_path, given, flag):
    with pytest.raises(ValueError, match=flag):
        TrainConfig(run_dir=tmp_path, **given)


def test_aux_id_without_a_layer_output_is_refused(run_dir, verifier, source):
    """HF hidden_states[0] (the embeddings) is no layer's output: DFlash cannot read it."""
    from specdraft.train.run import build_drafter, verifier_head, verifier_profile

    class Aux0:
        aux_layer_ids, hidden_size = (0, 2), source.hidden_size

    with pytest.raises(ConfigError, match=r"aux layer ids \[0, 2\].*hidden_states 1\.\.3"):
        build_drafter(cfg(run_dir), verifier_profile(cfg(run_dir), verifier, None), Aux0(),
                      verifier_head(verifier, run_dir), None, None)


def test_objective_counts_by_hand():
    """One row, T = 6, loss_mask [0,0,1,1,1,0] -> anchorable a (loss_mask[a+1]): 1, 2, 3; with
    block 3 (slots 1, 2) anchor 1 targets ids[2], ids[3] (both supervised), anchor 3 targets
    ids[4] then nothing (position 5 is not supervised)."""
    from specdraft.artifacts.batches import TrainBatch
    from specdraft.models.dflash import DFlashConfig, DFlashDraftModel
    from specdraft.train.dflash_objective import IGNORE, DFlashObjective

    c = DFlashConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                     intermediate_size=32, num_hidden_layers=1, rms_norm_eps=1e-6,
                     rope_theta=1e4, max_position_embeddings=64, vocab_size=50,
                     target_hidden_size=16, target_num_layers=4, target_layer_ids=(0, 1),
                     mask_token_id=49, block_size=3)
    obj = DFlashObjective(DFlashDraftModel(c), anchors=2, gamma=1.0)
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    sup = torch.tensor([[0, 1, 1, 1, 0, 0]], dtype=torch.bool)  # loss_mask[p + 1]
    batch = TrainBatch(ids, torch.randn(1, 6, 32), sup, torch.zeros(3, 4), ids.clone(), 6)
    batch.dflash_blocks = None
    obj.train()
    anchors, block_ids, targets = obj.blocks(batch)
    assert set(anchors.flatten().tolist()) <= {1, 2, 3}
    want = {1: [12, 13], 2: [13, 14], 3: [14, IGNORE]}
    for a, blk, tgt in zip(anchors[0].tolist(), block_ids[0].tolist(), targets[0].tolist()):
        assert blk == [ids[0, a].item(), 49, 49] and tgt == want[a]
    counts = obj.loss_counts(batch)
    assert counts.tolist() == [2.0, sum(want[a][1] != IGNORE for a in anchors[0].tolist())]
    out = obj(batch, counts)
    assert out.hits.shape == out.sup.shape == (2, 1, 2)
    assert out.sup.sum().item() == counts.sum().item()
    assert obj.weights == pytest.approx([1.0, torch.exp(torch.tensor(-1.0)).item()])


def test_export_checks_a_dflash_drafter_against_the_run(run_dir, verifier, source, tmp_path):
    """The trained drafter exports in vLLM's format only, and only against the aux ids it was
    trained on (both refusals name the cause; nothing written)."""
    from specdraft.artifacts.drafter import read_drafter
    from specdraft.artifacts.export import ExportRequest, validated_candidate
    from specdraft.artifacts.validate import ExportRefused

    run(cfg(run_dir, max_steps=2), verifier=verifier, source=source)
    src = read_drafter(run_dir / "train" / "last")
    good = validated_candidate(ExportRequest(format="vllm", aux_layers=(1, 2, 3)), src)
    assert good.config["dflash_config"]["target_layer_ids"] == [0, 1, 2]
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in good.tensors)
    with pytest.raises(ExportRefused, match="--format sglang: a DFlash drafter has one engine"):
        validated_candidate(ExportRequest(format="sglang", aux_layers=(1, 2, 3)), src)
    with pytest.raises(ExportRefused, match=r"reads HF hidden_states \[1, 2, 3\].*extracted aux "
                                            r"ids \[1, 2, 4\]"):
        validated_candidate(ExportRequest(format="vllm", aux_layers=(1, 2, 4)), src)


def test_run_config_defaults_for_dflash(tmp_path):
    """``train.drafter: dflash`` in a run config: export format vllm and eval k = block - 1
    unless given; an explicit sglang export is refused before any stage runs."""
    import yaml

    from specdraft.pipeline.config import PipelineConfig

    def load(**sections):
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "r"),
                                        "generate": {"prompts": "builtin:demo_train"},
                                        "eval": {"prompts": "builtin:demo_eval"}, **sections}))
        return PipelineConfig.from_yaml(path)

    c = load(train={"drafter": "dflash", "dflash_block_size": 6})
    assert (c.stages["export"].format, c.stages["eval"].k) == ("vllm", 5)
    assert str(c.stages["eval"].drafter).endswith("export/vllm")
    assert load(train={"drafter": "dflash"}, eval={"prompts": "builtin:demo_eval", "k": 3}
                ).stages["eval"].k == 3
    with pytest.raises(ConfigError, match=r"\[export\]: format 'sglang' with train.drafter"):
        load(train={"drafter": "dflash"}, export={"format": "sglang"})
