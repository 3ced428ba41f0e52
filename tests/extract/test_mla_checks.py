"""The traps of serving a DeepSeek-V3 / Kimi-K2 verifier through vLLM, each a check of specdraft's
own that fires before any engine starts (no vLLM needed): the MoE routing keys, aux id 0, and the
KV-cache layout vLLM's hidden-state capture cannot read (the engine's error turned into its
cause)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specdraft.core.errors import ConfigError
from specdraft.engines.verifier_dir import engine_hf_dir
from specdraft.extract.config import ExtractConfig
from specdraft.extract.run import run
from specdraft.extract.vllm_backend import engine_failure

from extract_helpers import random_rows, write_prepared

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kimi_fixture import kimi_config, make_kimi_verifier  # noqa: E402


@pytest.fixture(scope="module")
def kimi_verifier(tmp_path_factory, think_tokenizer_dir) -> Path:
    return make_kimi_verifier(tmp_path_factory.mktemp("kimi") / "verifier", think_tokenizer_dir)


def _with_config(tmp_path: Path, verifier: Path, **changes) -> Path:
    """A copy of ``verifier``'s config.json (only; the check reads nothing else) with ``changes``
    (value None = key removed)."""
    config = json.loads((verifier / "config.json").read_text())
    for k, v in changes.items():
        config.pop(k, None) if v is None else config.__setitem__(k, v)
    out = tmp_path / "verifier"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_fixture_config_is_kimi_shaped(kimi_verifier):
    """MLA widths vLLM's CPU backend runs (latent 512 + 64), YaRN as Kimi-K2 ships it, routing
    keys carried, dense first layer + shared expert."""
    c = json.loads((kimi_verifier / "config.json").read_text())
    assert c["architectures"] == ["DeepseekV3ForCausalLM"] and c["model_type"] == "deepseek_v3"
    assert c["kv_lora_rank"] + c["qk_rope_head_dim"] == 576
    assert c["rope_parameters"]["rope_type"] == "yarn" and c["rope_parameters"]["factor"] == 32
    assert (c["scoring_func"], c["topk_method"]) == ("sigmoid", "noaux_tc")
    assert c["first_k_dense_replace"] == 1 and c["n_shared_experts"] == 1
    assert engine_hf_dir(str(kimi_verifier), kimi_verifier) == kimi_verifier  # accepted


@pytest.mark.parametrize("key, value", [("scoring_func", None), ("scoring_func", "softmax"),
                                        ("topk_method", None), ("topk_method", "greedy")])
def test_routing_keys_refused_when_missing_or_different(tmp_path, kimi_verifier, key, value):
    """Planted: each routing key removed or changed; engine_hf_dir (shared by extract --backend
    vllm and eval --engine) refuses naming the key, the file and the fix."""
    bad = _with_config(tmp_path, kimi_verifier, **{key: value})
    with pytest.raises(ConfigError) as err:
        engine_hf_dir(str(bad), tmp_path)
    msg = str(err.value)
    assert str(bad / "config.json") in msg and f"has {key} {json.dumps(value)}" in msg
    assert "vLLM then" in msg and f"add \"{key}\"" in msg


def test_kimi_k25_text_config_is_checked(tmp_path, kimi_verifier):
    """Kimi-K2.5 nests the language model under text_config (model_type kimi_k2)."""
    text = {**kimi_config(100).to_dict(), "model_type": "kimi_k2"}
    text.pop("scoring_func")
    out = tmp_path / "verifier"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": "kimi_k25",
                                                 "text_config": text}))
    with pytest.raises(ConfigError, match="model_type kimi_k2 has scoring_func null"):
        engine_hf_dir(str(out), tmp_path)
    text["scoring_func"] = "sigmoid"
    (out / "config.json").write_text(json.dumps({"model_type": "kimi_k25",
                                                 "text_config": text}))
    assert engine_hf_dir(str(out), tmp_path) == out


def test_extract_vllm_refuses_before_writing(tmp_path, kimi_verifier, monkeypatch):
    """extract --backend vllm on a config without scoring_func: refused, no engine, no output."""
    bad = _with_config(tmp_path, kimi_verifier, scoring_func=None)
    ids, masks = random_rows([20], vocab=1000)
    run_dir = write_prepared(tmp_path / "run", ids, masks)
    monkeypatch.setenv("SPECDRAFT_VLLM_PYTHON", sys.executable)
    with pytest.raises(ConfigError, match="scoring_func"):
        run(ExtractConfig(run_dir=run_dir, verifier=str(bad), backend="vllm",
                          aux_layers=(1, 2, 3), dtype="float32", device="cpu"))
    assert not (run_dir / "extract" / "manifest.json").exists()
    assert not (run_dir / "extract" / "vllm").exists()


@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_aux_id_zero_refused_at_extract(tmp_path, kimi_verifier, backend, monkeypatch):
    """vLLM's DeepSeek model crashes capturing id 0 (its residual is still empty before layer 0);
    specdraft refuses id 0 for every family (core.conventions: ids in [1, N-1])."""
    ids, masks = random_rows([20], vocab=1000)
    run_dir = write_prepared(tmp_path / "run", ids, masks)
    monkeypatch.setenv("SPECDRAFT_VLLM_PYTHON", sys.executable)
    with pytest.raises(ConfigError, match=r"ids \[0\] are outside \[1, 3\]"):
        run(ExtractConfig(run_dir=run_dir, verifier=str(kimi_verifier), backend=backend,
                          aux_layers=(0, 2, 3), dtype="float32", device="cpu"))
    assert not (run_dir / "extract" / "manifest.json").exists()


def test_aux_id_zero_refused_at_export():
    """export's check of the ids the engine would capture, for the 4-layer fixture."""
    from specdraft.artifacts.validate import check_aux_ids
    from specdraft.models.eagle3 import Eagle3Config

    c = Eagle3Config(hidden_size=64, num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                     intermediate_size=128, rms_norm_eps=1e-6, rope_theta=50000.0,
                     max_position_embeddings=131072, vocab_size=100, draft_vocab_size=50,
                     target_hidden_size=64, aux_layer_ids=(0, 2, 3))
    cfg = {"eagle_aux_hidden_state_layer_ids": [0, 2, 3]}
    problems = check_aux_ids("vllm", cfg, c, None, 4)
    assert any("ids [0] are outside [1, 3]" in p for p in problems), problems


def test_uncapturable_kv_layout_named(tmp_path):
    """The engine's own error for a cache layout the capture cannot read becomes its cause and
    the way out, the engine's line kept."""
    log = tmp_path / "engine.log"
    log.write_text("INFO start\n[rank0]: ValueError: Could not uniquely identify the "
                   "extract-hidden-states KV cache group among 3 groups; the hidden-states layer "
                   "must be isolated in its own group (MLA verifiers are unsupported).\n")
    msg = engine_failure(log, 1)
    assert msg.startswith("the verifier's KV-cache layout is one vLLM's hidden-state capture "
                          "cannot read") and "--backend transformers" in msg
    assert "Could not uniquely identify" in msg and str(log) in msg


def test_quantized_checkpoint_transformers_cannot_load_is_named(tmp_path, kimi_verifier):
    """Kimi-K2.5 ships INT4 ``compressed-tensors`` weights; transformers without that package
    (specdraft's venv) cannot load them. extract --backend transformers says which field, why,
    and the way out (the engine), with no shard, index or manifest written."""
    import shutil

    from specdraft.core.errors import InputError

    if __import__("importlib").util.find_spec("compressed_tensors") is not None:
        from prerequisites import missing

        missing("compressed-tensors is installed: transformers would try to load the checkpoint",
                "a venv without compressed-tensors, as specdraft's own")
    q = tmp_path / "quantized"
    shutil.copytree(kimi_verifier, q)
    config = json.loads((q / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors",
                                     "format": "pack-quantized"}
    (q / "config.json").write_text(json.dumps(config))
    ids, masks = random_rows([20], vocab=1000)
    run_dir = write_prepared(tmp_path / "run", ids, masks)
    with pytest.raises(InputError, match=r"config.json: quantization_config.quant_method "
                       r"'compressed-tensors': transformers could not load .*\(extract "
                       r"--backend vllm") as err:
        run(ExtractConfig(run_dir=run_dir, verifier=str(q), backend="transformers",
                          aux_layers=(1, 2, 3), dtype="float32", device="cpu"))
    assert "compressed-tensors" in str(err.value.__cause__)
    extract = run_dir / "extract"
    assert not (extract / "manifest.json").exists() and not (extract / "shards").exists()
    assert not list(extract.glob("*.safetensors")) and not (extract / "index.jsonl").exists()
