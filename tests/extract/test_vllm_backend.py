"""The vLLM backend's parts that need no engine: conversion of an engine file into our rows,
the token-id check, layer ids, replica devices, engine settings and error reports."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from specdraft.core.errors import ConfigError, InputError
from specdraft.core.capture import capture_packed
from specdraft.core.batching import pad_rows
from specdraft.extract.config import ExtractConfig
from specdraft.core.storage import CODECS
from specdraft.core.aux_ids import extraction_capture_ids
from specdraft.extract.vllm_backend import (EngineVerifier, engine_failure, final_norm, read_row,
                                            replica_devices, to_packed)
from specdraft.extract.vllm_worker import CONNECTOR, CONNECTOR_MODULE, engine_kwargs


def engine_verifier(model) -> EngineVerifier:
    base = model.model
    return EngineVerifier(hf_dir=None, n_layers=len(base.layers), hidden_size=64,
                          dtype=torch.float32, architecture="LlamaForCausalLM", head={},
                          norm_weight=base.norm.weight.detach(), eps=base.norm.variance_epsilon)


def test_to_packed_equals_capture_from_engine_like_states(tiny_model):
    """States laid out as vLLM hands them over (ids ascending, id N before the final norm)
    become exactly what the transformers capture packs, for every codec."""
    torch.manual_seed(0)
    saved = tiny_model.model.norm.weight.detach().clone()
    try:
        with torch.no_grad():
            tiny_model.model.norm.weight.copy_(0.5 + torch.rand(64))  # a non-unit norm weight
        _check_to_packed(tiny_model)
    finally:
        with torch.no_grad():
            tiny_model.model.norm.weight.copy_(saved)


def _check_to_packed(tiny_model) -> None:
    ids = [[int(t) for t in torch.randint(0, 2000, (17,))]]
    mask = [[0] * 6 + [1] * 11]
    with torch.no_grad():
        out = tiny_model.model(input_ids=torch.tensor(ids), output_hidden_states=True)
        pre_norm = tiny_model.model.layers[-1](out.hidden_states[3],
                                               position_embeddings=tiny_model.model.rotary_emb(
                                                   out.hidden_states[3],
                                                   torch.arange(17)[None]))[0]  # [1, T, H]
    if isinstance(pre_norm, tuple):
        pre_norm = pre_norm[0]
    pre_norm = pre_norm[0] if pre_norm.dim() == 3 else pre_norm
    engine_ids = extraction_capture_ids((3, 1, 4), 4)
    assert engine_ids == [1, 3, 4]
    hidden = torch.stack([out.hidden_states[1][0], out.hidden_states[3][0], pre_norm], dim=1)
    v = engine_verifier(tiny_model)
    assert torch.allclose(final_norm(pre_norm, v.norm_weight, v.eps), out.hidden_states[4][0],
                          atol=1e-5)
    for name, codec in CODECS.items():
        got = to_packed(hidden, mask[0], (3, 1, 4), engine_ids, v, codec)
        ref = capture_packed(tiny_model, pad_rows(ids, mask), (3, 1, 4), codec)
        assert got.lengths == ref.lengths and got.n_sup == ref.n_sup == [11]
        for a, b in ((got.aux, ref.aux), (got.final, ref.final)):
            assert torch.allclose(a[0].float(), b[0].float(), rtol=2**-3 if "fp8" in name
                                  else 2**-7, atol=1e-4), name


def test_read_row_rejects_other_token_ids(tmp_path):
    path = tmp_path / "row000000007.safetensors"
    save_file({"hidden_states": torch.zeros(4, 2, 8), "token_ids": torch.tensor([5, 6, 9, 8])},
              str(path))
    assert read_row(path, "s7/0", [5, 6, 9, 8]).shape == (4, 2, 8)
    with pytest.raises(InputError, match=r"row s7/0: .* first difference at position 2"):
        read_row(path, "s7/0", [5, 6, 7, 8])
    with pytest.raises(InputError, match=r"row s7/0: the engine saw 4 token ids, the prepared "
                                         r"row has 5"):
        read_row(path, "s7/0", [5, 6, 9, 8, 1])


def test_replica_devices_split_visible_gpus():
    assert replica_devices(0, 8, None) == "0,1,2,3,4,5,6,7"
    assert replica_devices(1, 2, "4,5,6,7") == "6,7"
    with pytest.raises(ConfigError, match="needs 4 GPUs"):
        replica_devices(1, 4, "0,1,2,3")


def test_engine_settings_carry_parallelism_connector_and_overrides():
    cfg = ExtractConfig(run_dir="r", backend="vllm", tensor_parallel_size=8,
                        pipeline_parallel_size=2, engine_args='{"max_num_seqs": 64}')
    job = {"model": "m", "dtype": "bfloat16", "max_model_len": 99, "engine_ids": [2, 30, 61],
           "spool": "/s", "tensor_parallel_size": cfg.tensor_parallel_size,
           "pipeline_parallel_size": cfg.pipeline_parallel_size, "engine_args": cfg.engine_args}
    kw = engine_kwargs(job)
    assert kw["tensor_parallel_size"] == 8 and kw["pipeline_parallel_size"] == 2
    assert kw["max_num_seqs"] == 64 and kw["max_model_len"] == 99
    spec = kw["speculative_config"]
    assert spec["method"] == "extract_hidden_states"
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 30,
                                                                                           61]
    kv = kw["kv_transfer_config"]
    assert (kv["kv_connector"], kv["kv_connector_module_path"]) == (CONNECTOR, CONNECTOR_MODULE)
    with pytest.raises(ValueError, match="JSON object"):
        ExtractConfig(run_dir="r", engine_args="[1]")


def test_engine_failure_names_the_engines_error(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("INFO loading\n[rank0]: Traceback (most recent call last):\n"
                   "[rank0]:   File x.py\n[rank0]: ValueError: prompt too long (20 > 16)\n"
                   "INFO shutting down\n")
    msg = engine_failure(log, 1)
    assert "status 1: ValueError: prompt too long (20 > 16)" in msg and str(log) in msg


def test_engine_replicas_take_the_torchrun_plan(tmp_path, tiny_model, monkeypatch):
    """Rank r of W hands its engine exactly the rows of batches r, r+W, … of the transformers
    plan (the engine is replaced by the HF capture of the same rows), in plan order, and its
    shards hold them as the transformers backend's rank r would."""
    from extract_helpers import random_rows, write_prepared
    from specdraft.extract import run as run_mod
    from specdraft.extract import vllm_backend
    from specdraft.core.batching import plan_batches, rank_batches

    lens = [20 + (7 * i) % 30 for i in range(14)]
    ids, masks = random_rows(lens, vocab=2000, seed=5)
    run_dir = write_prepared(tmp_path / "run", ids, masks)
    seen: dict[int, list[int]] = {}

    def fake_engine(verifier, config, out, ctx, rank, world, rows, r_ids, r_masks, writer,
                    progress=None):
        seen[rank] = list(rows)
        for r, a, m in zip(rows, r_ids, r_masks):
            writer.submit([r], [a], [m], capture_packed(tiny_model, pad_rows([a], [m]),
                                                        ctx.aux_ids, ctx.codec))
        return {}

    monkeypatch.setattr(vllm_backend, "extract_rows", fake_engine)
    cfg = ExtractConfig(run_dir=run_dir, backend="vllm", aux_layers=(1, 2), batch_tokens=90,
                        storage="fp32", shard_mb=0.02)
    ds = run_mod._load_dataset(run_dir)
    out = run_dir / "extract"
    (out / "shards").mkdir(parents=True)
    plan = plan_batches(lens, 90)
    for rank in (0, 1):
        ctx = run_mod._context(cfg, tiny_model, ds, rank, 2)
        stats = run_mod._extract_rank_vllm(tiny_model, ds, cfg, out, ctx, rank, 2)
        assert seen[rank] == [r for b in rank_batches(plan, rank, 2) for r in b.rows]
        assert stats["samples"] == len(seen[rank]) and stats["shards_written"] == len(
            ctx.shards)
    assert sorted(seen[0] + seen[1]) == list(range(14))
    entries = run_mod._merge_index(out, 2, 14)  # every row exactly once, dataset order
    assert {e["shard"].split("/")[1][:9] for e in entries} == {"rank00000", "rank00001"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_final_norm_follows_each_gain_convention(dtype):
    """final_norm equals transformers' own norm module bit for bit: LlamaRMSNorm for ``w``,
    Gemma3RMSNorm for ``1+w`` (the oracle); the other convention differs."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    x = (torch.randn(5, 64) * 7).to(dtype)
    w = torch.randn(64) * 0.3
    gemma, llama = Gemma3RMSNorm(64, eps=1e-6), LlamaRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        gemma.weight.copy_(w)
        llama.weight.copy_(1 + w)
        llama.to(dtype)
    with torch.no_grad():
        assert torch.equal(final_norm(x, w, 1e-6, "1+w"), gemma(x))
        assert torch.equal(final_norm(x, (1 + w).to(dtype), 1e-6, "w"), llama(x))
        assert not torch.allclose(final_norm(x, w.to(dtype), 1e-6, "w"), gemma(x), atol=1e-2)
    with pytest.raises(ConfigError, match="final norm gain 'x'"):
        final_norm(x, w, 1e-6, "x")


def test_engine_verifier_gain_from_model_type(tmp_path):
    """load_engine_verifier takes the gain from model_type and refuses an unknown family."""
    import json

    from specdraft.extract.vllm_backend import load_engine_verifier

    H, V = 8, 16
    save_file({"model.embed_tokens.weight": torch.zeros(V, H), "lm_head.weight": torch.zeros(V, H),
               "model.norm.weight": torch.zeros(H)}, str(tmp_path / "model.safetensors"))
    for model_type, gain in (("gemma3_text", "1+w"), ("qwen3", "w")):
        (tmp_path / "config.json").write_text(json.dumps({
            "model_type": model_type, "num_hidden_layers": 2, "hidden_size": H}))
        assert load_engine_verifier(tmp_path, torch.float32).norm_gain == gain
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mystery", "hidden_size": H}))
    with pytest.raises(ConfigError, match="model_type 'mystery' has no known final-norm gain"):
        load_engine_verifier(tmp_path, torch.float32)
