"""`specdraft export`: engine loaders find every weight, embeddings are never random, every
problem is listed before anything is written."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine_loaders import sglang_load, vllm_load
from export_kit import FakeStage, make_drafter, make_run, vocab_map
from specdraft.core.manifest import StageClock, write_manifest
from specdraft.export.config import ExportConfig
from specdraft.export.run import run
from specdraft.artifacts.validate import ExportRefused
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel
from specdraft.models.io import save_drafter


@pytest.fixture
def trained_run(tmp_path, six_layer_verifier):
    drafter = make_drafter(six_layer_verifier)
    return make_run(tmp_path / "run", six_layer_verifier, drafter), drafter


def export(run_dir, fmt, out=None, **kw):
    return run(ExportConfig(run_dir=run_dir, format=fmt, out=out, **kw))


@pytest.mark.parametrize("fmt,loader", [("sglang", vllm_load), ("sglang", sglang_load),
                                        ("vllm", vllm_load)])
def test_engine_loaders_take_every_weight(trained_run, six_layer_verifier, fmt, loader):
    run_dir, drafter = trained_run
    m = export(run_dir, fmt)
    out = run_dir / "export" / fmt
    assert m["out"] == str(out) and (run_dir / "export" / "manifest.json").exists()
    params, problems = loader(out)
    assert problems == []
    sd = drafter.state_dict()
    qkv = [p for n, p in params.items() if n.endswith("qkv_proj.weight")][0]
    torch.testing.assert_close(qkv, torch.cat([sd["midlayer.self_attn.q_proj.weight"],
                                               sd["midlayer.self_attn.k_proj.weight"],
                                               sd["midlayer.self_attn.v_proj.weight"]]))
    gate_up = [p for n, p in params.items() if n.endswith("gate_up_proj.weight")][0]
    torch.testing.assert_close(gate_up, torch.cat([sd["midlayer.mlp.gate_proj.weight"],
                                                   sd["midlayer.mlp.up_proj.weight"]]))
    # the draft ids map to the verifier ids that t2d marks
    target = params.get("hot_token_id", params.get("draft_id_to_target_id"))
    if "draft_id_to_target_id" in params:
        target = torch.arange(len(target)) + target
    assert torch.equal(target, torch.nonzero(sd["t2d"]).flatten())
    cfg = json.loads((out / "config.json").read_text())
    # fc input where the engines read it (3 x target_hidden_size) equals the tensor's
    assert 3 * cfg["target_hidden_size"] == load_file(str(out / "model.safetensors"))[
        "fc.weight"].shape[1] == 3 * 64


def test_exported_embedding_is_the_verifiers(trained_run, six_layer_verifier):
    run_dir, _ = trained_run
    export(run_dir, "sglang")
    w = load_file(str(run_dir / "export" / "sglang" / "model.safetensors"))
    assert torch.equal(w["embed_tokens.weight"], six_layer_verifier.get_input_embeddings().weight)
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool


def test_trained_state_without_embedding(trained_run, six_layer_verifier):
    run_dir, _ = trained_run
    path = run_dir / "train" / "best" / "drafter.safetensors"
    state = load_file(str(path))
    del state["embed_tokens.weight"]
    save_file(state, str(path))
    export(run_dir, "sglang")
    w = load_file(str(run_dir / "export" / "sglang" / "model.safetensors"))
    assert torch.equal(w["embed_tokens.weight"], six_layer_verifier.get_input_embeddings().weight)
    # without any source of the verifier's embedding it is omitted, never made up
    (run_dir / "extract" / "verifier_head.safetensors").unlink()
    export(run_dir, "vllm")
    assert "embed_tokens.weight" not in load_file(
        str(run_dir / "export" / "vllm" / "model.safetensors"))


def test_random_trained_embedding_is_refused(tmp_path, six_layer_verifier):
    drafter = make_drafter(six_layer_verifier)
    torch.nn.init.normal_(drafter.embed_tokens.weight)
    run_dir = make_run(tmp_path / "run", six_layer_verifier, drafter)
    with pytest.raises(ExportRefused, match="not the verifier's embedding"):
        export(run_dir, "sglang")
    assert not (run_dir / "export").exists()


def test_every_problem_listed_and_nothing_written(tmp_path, six_layer_verifier):
    drafter = make_drafter(six_layer_verifier)
    drafter.d2t[3] = drafter.d2t[2] - 1  # arange + d2t no longer increasing
    run_dir = make_run(tmp_path / "run", six_layer_verifier, drafter, extract_aux=[2, 3, 5])
    path = run_dir / "train" / "best" / "drafter.safetensors"
    state = load_file(str(path))
    del state["norm.weight"]
    save_file(state, str(path))
    with pytest.raises(ExportRefused) as err:
        export(run_dir, "sglang")
    assert err.value.problems == [
        "missing tensor norm.weight",
        "arange(K) + d2t is not strictly increasing (duplicate or unsorted target ids)",
        "aux ids [2, 3, 4] differ from the ids used at extraction [2, 3, 5] "
        "(RUN/extract/manifest.json aux_layer_ids)"]
    assert not (run_dir / "export").exists()


def test_refuses_to_clobber(trained_run):
    run_dir, _ = trained_run
    export(run_dir, "sglang")
    from specdraft.core.errors import StageDirError

    with pytest.raises(StageDirError, match="--overwrite"):
        export(run_dir, "sglang")
    export(run_dir, "sglang", overwrite=True)
    export(run_dir, "speculators")  # another format beside it is fine
    assert (run_dir / "export" / "speculators" / "config.json").exists()


def four_aux_drafter(tmp_path, extract_ids):
    """4 aux layers, target hidden 8 (fc input 32), vocab 40, draft vocab 10."""
    c = Eagle3Config(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                     intermediate_size=16, rms_norm_eps=1e-5, rope_theta=1e4,
                     max_position_embeddings=512, vocab_size=40, draft_vocab_size=10,
                     target_hidden_size=8, aux_layer_ids=(2, 4, 6, 8))
    torch.manual_seed(0)
    m = Eagle3DraftModel(c)
    d2t, t2d = vocab_map(list(range(0, 40, 4)), 40)
    m.d2t.copy_(d2t)
    m.t2d.copy_(t2d)
    run_dir = tmp_path / "run"
    save_drafter(m, run_dir / "train" / "best")
    # no verifier here: drop the (random) embedding, which export could not check
    path = run_dir / "train" / "best" / "drafter.safetensors"
    state = load_file(str(path))
    del state["embed_tokens.weight"]
    save_file(state, str(path))
    write_manifest(run_dir / "extract", stage="extract", config=FakeStage(), clock=StageClock(),
                   extra={"aux_layer_ids": extract_ids, "n_layers": 12, "hidden_size": 8,
                          "vocab_size": 40, "storage": {"format": "bf16"}})
    return run_dir


def test_four_aux_layers_fc_input_32(tmp_path):
    run_dir = four_aux_drafter(tmp_path, [2, 4, 6, 8])
    export(run_dir, "speculators", embed="omit")
    out = run_dir / "export" / "speculators"
    cfg = json.loads((out / "config.json").read_text())
    w = load_file(str(out / "model.safetensors"))
    # speculators/models/eagle3/core.py: fc = Linear(len(ids) * transformer_layer_config.hidden_size)
    assert len(cfg["eagle_aux_hidden_state_layer_ids"]) * \
        cfg["transformer_layer_config"]["hidden_size"] == 32 == w["fc.weight"].shape[1]
    assert "layers.0.self_attn.q_proj.weight" in w and not any("midlayer" in k for k in w)
    # vLLM/SGLang build fc as 3 x target_hidden_size = 24: they cannot load it -> refused
    with pytest.raises(ExportRefused, match="input width 24"):
        export(run_dir, "sglang", embed="omit")


def test_mismatching_extraction_manifest_refused(tmp_path):
    run_dir = four_aux_drafter(tmp_path, [2, 4, 6, 9])
    with pytest.raises(ExportRefused, match=r"ids used at extraction \[2, 4, 6, 9\]"):
        export(run_dir, "speculators", embed="omit")


def test_every_export_is_listed_with_its_provenance(trained_run):
    run_dir, _ = trained_run
    first = export(run_dir, "sglang")
    second = export(run_dir, "vllm")
    manifest = json.loads((run_dir / "export" / "manifest.json").read_text())
    assert manifest["format"] == "vllm" and sorted(manifest["exports"]) == ["sglang", "vllm"]
    for fmt, m in (("sglang", first), ("vllm", second)):
        prov = json.loads((run_dir / "export" / fmt / "provenance.json").read_text())
        assert manifest["exports"][fmt]["out"] == str(run_dir / "export" / fmt)
        assert prov["stage"] == "export" and prov["format"] == fmt
        assert prov["config_hash"] == m["config_hash"] == manifest["exports"][fmt]["config_hash"]
        assert prov["inputs"] == m["inputs"] and set(prov["inputs"]) == {"extract", "train"}
    shutil.rmtree(run_dir / "export" / "sglang")       # gone from disk: no longer listed
    assert sorted(export(run_dir, "speculators", verifier_name="v")["exports"]) == \
        ["speculators", "vllm"]
