"""Export and the verifier profile: the rotary keys each engine reads, the refusals, and the
re-check of the drafter's profile against RUN/extract's and against ``--verifier``'s."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from export_kit import make_drafter, make_run
from specdraft.core.manifest import read_manifest
from specdraft.core.profile import VerifierProfile, resolve_profile
from specdraft.export.config import ExportConfig
from specdraft.artifacts.formats import build_config, engine_rope_read
from specdraft.export.run import run
from specdraft.artifacts.validate import ExportRefused, check_rotary
from specdraft.models.eagle3 import Eagle3Config

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def drafter_config(**kw) -> Eagle3Config:
    values = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                  max_position_embeddings=131072, vocab_size=100, draft_vocab_size=20,
                  target_hidden_size=64, aux_layer_ids=(2, 3, 4), rope_scaling=LLAMA3,
                  partial_rotary_factor=0.5)
    values.update(kw)
    return Eagle3Config(**values)


@pytest.mark.parametrize("fmt", ["sglang", "vllm", "speculators"])
def test_rotary_keys_written_where_each_engine_reads_them(fmt):
    from transformers import LlamaConfig

    c = drafter_config()
    cfg = build_config(fmt, c, verifier_name="v")
    layer = cfg["transformer_layer_config"] if fmt == "speculators" else cfg
    want = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
            "partial_rotary_factor": 0.5}
    assert layer["rope_parameters"] == want                          # vLLM get_rope
    assert (layer["rope_theta"], layer["rope_scaling"], layer["partial_rotary_factor"],
            layer["head_dim"]) == (500000.0, LLAMA3, 0.5, 16)          # SGLang LlamaAttention
    assert layer["tie_word_embeddings"] is False
    assert engine_rope_read(layer, "vllm") == engine_rope_read(layer, "sglang") == want
    # transformers (what both engines parse config.json with) folds it to the same parameters
    assert LlamaConfig.from_dict(copy.deepcopy(layer)).rope_parameters == want
    assert check_rotary(fmt, cfg, c) == []


def test_each_lost_rotary_key_is_caught():
    c = drafter_config()
    cfg = build_config("sglang", c)
    no_partial = {**cfg, "partial_rotary_factor": 1.0}
    assert any("sglang loader would build rotary" in p and "partial_rotary_factor" in p
               for p in check_rotary("sglang", no_partial, c))
    no_params = {**cfg, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    assert any("vllm loader would build rotary" in p and "factor" in p
               for p in check_rotary("sglang", no_params, c))
    tied = {**cfg, "tie_word_embeddings": True}
    assert any("tie_word_embeddings must be false" in p for p in check_rotary("sglang", tied, c))
    wrong_head = {**cfg, "head_dim": 32}
    assert any("head_dim 32" in p for p in check_rotary("sglang", wrong_head, c))


@pytest.mark.parametrize("rope,reason", [
    ({"rope_type": "dynamic", "factor": 2.0}, "dynamic NTK"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
      "original_max_position_embeddings": 64}, "longrope"),
    ({"rope_type": "default", "mrope_section": [2, 3, 3]}, "multimodal rotary"),
])
def test_rotary_the_engines_cannot_express_is_refused_with_the_reason(rope, reason):
    c = drafter_config(rope_scaling=rope, partial_rotary_factor=1.0)
    problems = check_rotary("sglang", build_config("sglang", c), c)
    assert any(reason in p for p in problems), problems


@pytest.fixture
def trained_run(tmp_path, six_layer_verifier):
    drafter = make_drafter(six_layer_verifier)
    return make_run(tmp_path / "run", six_layer_verifier, drafter), drafter


def test_profile_travels_to_the_export_and_is_rechecked(trained_run, six_layer_verifier,
                                                        six_layer_verifier_dir, tmp_path):
    run_dir, drafter = trained_run
    want = resolve_profile(six_layer_verifier.config, model=six_layer_verifier)
    assert VerifierProfile.from_dict(drafter.config.verifier_profile) == want
    m = run(ExportConfig(run_dir=run_dir, verifier=str(six_layer_verifier_dir)))
    prov = json.loads((run_dir / "export" / "sglang" / "provenance.json").read_text())
    assert VerifierProfile.from_dict(prov["verifier_profile"]) == want
    assert m["verifier_profile"] == want.to_dict()
    # another verifier (same shapes, another rope theta) is refused, the field named
    other = tmp_path / "other_verifier"
    shutil.copytree(six_layer_verifier_dir, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg.get("rope_parameters", {}), "rope_theta": 250000.0}
    cfg.pop("rope_theta", None)
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportRefused, match=r"differs from --verifier .*rotary: .*250000\.0"):
        run(ExportConfig(run_dir=run_dir, verifier=str(other), overwrite=True))


def test_extraction_profile_of_another_verifier_is_refused(trained_run):
    run_dir, drafter = trained_run
    manifest = read_manifest(run_dir / "extract")
    profile = dict(drafter.config.verifier_profile, rms_norm_eps=1e-3)
    (run_dir / "extract" / "manifest.json").write_text(json.dumps({**manifest,
                                                                   "profile": profile}))
    with pytest.raises(ExportRefused, match=r"differs from RUN/extract/manifest.json profile: "
                                            r"rms_norm_eps: 1e-06 != 0.001"):
        run(ExportConfig(run_dir=run_dir))


def test_the_run_s_profile_in_verifier_json_is_what_export_checks(trained_run):
    """A run with ``RUN/verifier.json``: the drafter's profile is checked against that record
    (the one home of the run's profile), not against RUN/extract's manifest."""
    from specdraft.artifacts.verifier_contract import Loading, VerifierContract

    run_dir, drafter = trained_run
    profile = dict(drafter.config.verifier_profile, rms_norm_eps=1e-3)
    contract = VerifierContract(written_by="prepare", loading=Loading(verifier="tiny"),
                                tokenizer_sha256="0" * 64, vocab_size=1, tokenizer_size=1,
                                profile=profile)
    (run_dir / "verifier.json").write_text(contract.model_dump_json())
    with pytest.raises(ExportRefused, match=r"differs from RUN/verifier.json profile: "
                                            r"rms_norm_eps: 1e-06 != 0.001"):
        run(ExportConfig(run_dir=run_dir))
