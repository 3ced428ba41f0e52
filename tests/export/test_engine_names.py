"""vLLM's weight-name read-back (:mod:`specdraft.artifacts.engine_names`) for every attention
variant vLLM 0.32's EAGLE-3 loaders distinguish: the Llama layer (three formats), the Qwen3
layer (q/k norms), EAGLE-3.1's norms, and the MLA layer with ``q_lora_rank`` set (the fused
``q_a_proj`` + ``kv_a_proj_with_mqa``) and null (which vLLM cannot load).

Each variant is read back twice: through specdraft's table of the rules and through the
installed vLLM's own ``WeightsMapper`` (the vLLM venv; a missing venv skips here, fails under
CI), and both must agree.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdraft.artifacts.engine_names import (INNER_MODELS, TABLE_RULES,  # noqa: E402
                                              name_problems, table_mapper)
from specdraft.artifacts.export import export_tensors  # noqa: E402
from specdraft.artifacts.formats import build_config  # noqa: E402
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel  # noqa: E402
from specdraft.models.eagle3_mla import (Eagle3MLAConfig, Eagle3MLADraftModel,  # noqa: E402
                                         vllm_checkpoint)

BASE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=96, rms_norm_eps=1e-6, rope_theta=10000.0,
            max_position_embeddings=2048, vocab_size=256, draft_vocab_size=64,
            target_hidden_size=64, aux_layer_ids=(1, 2, 3))
# DeepSeek-V3's MLA shape at tiny widths (tests/family_configs.py): nope 8 + rope 8, v 16
MLA = dict(BASE, num_key_value_heads=4, head_dim=16, kv_lora_rank=16, qk_nope_head_dim=8,
           qk_rope_head_dim=8, v_head_dim=16)


def llama_export(fmt: str, **fields):
    """(config.json, tensor names) of a random Llama/Qwen3-layer drafter exported in ``fmt``."""
    c = Eagle3Config(**BASE, **fields)
    state = Eagle3DraftModel(c).checkpoint_state()
    return build_config(fmt, c), sorted(export_tensors(fmt, state, None, "auto"))


def mla_export(q_lora_rank):
    cfg, tensors = vllm_checkpoint(Eagle3MLADraftModel(Eagle3MLAConfig(**MLA,
                                                                       q_lora_rank=q_lora_rank)))
    return cfg, sorted(tensors)


VARIANTS = {
    "llama sglang": lambda: llama_export("sglang"),
    "llama vllm": lambda: llama_export("vllm"),
    "llama speculators": lambda: llama_export("speculators"),
    "llama EAGLE-3.1 norms": lambda: llama_export("vllm", norm_before_fc=True, fc_norm=True,
                                                  norm_output=True),
    "qwen3 vllm": lambda: llama_export("vllm", draft_layer="qwen3"),
    "qwen3 speculators": lambda: llama_export("speculators", draft_layer="qwen3"),
    "mla q_lora_rank 32": lambda: mla_export(32),
}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The installed vLLM's mapper: its worker run once for the module (no memo, an empty disk
    cache), so the names below are mapped by vLLM's own code; the answer is cached on disk."""
    from stubs import vllm_python_or_skip

    from specdraft.engines import vllm_names

    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(cache))
        mp.setattr(vllm_names, "_MEMO", {})
        mapper, source = vllm_names.installed_mapper(vllm_python_or_skip())
        assert source.startswith("vLLM 0.32"), source
        assert len(list((cache / "specdraft").glob("vllm-names-*.json"))) == 1
        yield mapper, source


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_lands_on_the_engines_parameters(variant, installed):
    cfg, names = VARIANTS[variant]()
    fmt = next((f for f in ("sglang", "speculators") if f in variant), "vllm")
    assert name_problems(fmt, cfg, names, table_mapper, "table") == []
    assert name_problems(fmt, cfg, names, *installed) == []


def test_mla_without_a_low_rank_query_does_not_load_and_says_why(installed):
    """vLLM 0.32 deepseek_eagle3.py stacks kv_a_proj_with_mqa into fused_qkv_a_proj, which the
    attention has only with a q_lora_rank: the null-rank drafter is refused with the cause."""
    cfg, names = mla_export(None)
    for mapper, source in ((table_mapper, "table"), installed):
        problems = name_problems("vllm", cfg, names, mapper, source)
        assert problems[0].startswith(
            "midlayer.self_attn.kv_a_proj_with_mqa.weight: vLLM's loader")
        assert "model.layers.0.self_attn.fused_qkv_a_proj.weight" in problems[0]
        assert "q_lora_rank null cannot load" in problems[0]
        assert problems[1:] == [f"model.layers.0.self_attn.kv_a_proj_with_mqa.weight: no tensor "
                                f"of the export fills this parameter of vLLM's "
                                f"Eagle3DeepseekV2ForCausalLM ({source})"]


def test_planted_name_faults_are_named():
    """A dropped shard of a fused parameter, a renamed tensor and a missing norm, each named."""
    cfg, names = llama_export("vllm", draft_layer="qwen3")
    no_k = [n for n in names if "k_proj" not in n]
    assert name_problems("vllm", cfg, no_k, table_mapper, "t") == [
        "model.layers.0.self_attn.qkv_proj.weight: shard(s) ['k'] not filled by any tensor (t)"]
    renamed = [n.replace("q_norm", "query_norm") for n in names]
    got = name_problems("vllm", cfg, renamed, table_mapper, "t")
    assert got[0].startswith("midlayer.self_attn.query_norm.weight: vLLM's loader (t) maps it "
                             "to model.layers.0.self_attn.query_norm.weight, which the "
                             "Eagle3Qwen3ForCausalLM")
    assert got[1] == ("model.layers.0.self_attn.q_norm.weight: no tensor of the export fills "
                      "this parameter of vLLM's Eagle3Qwen3ForCausalLM (t)")
    cfg31, names31 = llama_export("vllm", norm_before_fc=True)
    assert name_problems("vllm", cfg31, [n for n in names31 if n != "input_norm.weight"],
                         table_mapper, "t") == [
        "model.input_norm.weight: no tensor of the export fills this parameter of vLLM's "
        "LlamaForCausalLMEagle3 (t)"]


def test_the_table_is_the_installed_engines_mapping(installed):
    """specdraft's table of the rules (used where no vLLM python exists) maps every name an
    export can hold exactly as the installed vLLM's own WeightsMapper does."""
    from specdraft.engines.vllm_names import COMMON_NAMES

    mapper, _ = installed
    assert set(TABLE_RULES) == set(INNER_MODELS.values())
    for module_class in TABLE_RULES:
        assert table_mapper(module_class, COMMON_NAMES) == mapper(module_class, COMMON_NAMES), \
            module_class


def test_an_mla_drafter_for_a_full_rank_query_verifier_gets_a_low_rank_query():
    """A DeepSeek-V3-shaped verifier with q_lora_rank null (tests/family_configs.py's, the
    query made full-rank): the MLA drafter train builds takes q_lora_rank = kv_lora_rank, so
    its export loads in vLLM."""
    from family_configs import tiny_config

    from specdraft.core.profile import resolve_profile

    hf = tiny_config("deepseek_v3", 256)
    hf.q_lora_rank = None
    profile = resolve_profile(hf)
    assert profile.mla.q_lora_rank is None
    c = Eagle3MLAConfig.from_profile(profile, draft_vocab_size=64, aux_layer_ids=(1, 2, 3))
    assert c.q_lora_rank == c.kv_lora_rank == 16
    cfg, tensors = vllm_checkpoint(Eagle3MLADraftModel(c))
    assert cfg["q_lora_rank"] == 16
    assert name_problems("vllm", cfg, sorted(tensors), table_mapper, "t") == []
    assert torch.Size([16, 128]) == tensors["midlayer.self_attn.q_a_proj.weight"].shape


def test_export_refuses_an_mla_drafter_with_a_full_rank_query(tmp_path):
    """``specdraft export --format vllm`` of an MLA drafter written with q_lora_rank null (as
    train built it before the low-rank query rule) for a verifier whose query is full-rank:
    refused before a byte is written, naming vLLM's fused_qkv_a_proj and the cause."""
    from dataclasses import replace

    from kimi_fixture import kimi_config
    from test_export_mla import random_mla_drafter
    from transformers import AutoModelForCausalLM

    from specdraft.artifacts.validate import ExportRefused
    from specdraft.export.config import ExportConfig
    from specdraft.export.run import run as export
    from specdraft.models.io import save_drafter

    torch.manual_seed(0)
    hf = kimi_config(1024)
    hf.q_lora_rank = None
    verifier = AutoModelForCausalLM.from_config(hf).eval()
    verifier.save_pretrained(tmp_path / "verifier")
    drafter = random_mla_drafter(verifier)
    old = Eagle3MLADraftModel(replace(drafter.config, q_lora_rank=None)).eval()
    state = {k: v for k, v in drafter.state_dict().items() if "q_a_" not in k and "q_b_" not in k}
    old.load_state_dict(state, strict=False)
    save_drafter(old, tmp_path / "drafter")
    with pytest.raises(ExportRefused, match="q_lora_rank null cannot load") as err:
        export(ExportConfig(drafter=tmp_path / "drafter", out=tmp_path / "out", format="vllm",
                            verifier=str(tmp_path / "verifier"), aux_layers=(1, 2, 3)))
    assert "fused_qkv_a_proj" in str(err.value)
    assert not (tmp_path / "out").exists()
    save_drafter(drafter, tmp_path / "new")  # the drafter train builds now: a low-rank query
    assert drafter.config.q_lora_rank == 512
    export(ExportConfig(drafter=tmp_path / "new", out=tmp_path / "ok", format="vllm",
                        verifier=str(tmp_path / "verifier"), aux_layers=(1, 2, 3)))
    assert (tmp_path / "ok" / "model.safetensors").exists()


def test_a_full_draft_vocabulary_with_d2t_does_not_load():
    """Draft vocab = the whole vocab: vLLM's drafter then has no draft_id_to_target_id
    parameter (llama_eagle3.py / deepseek_eagle3.py) and its loader refuses the d2t tensor;
    the read-back names it and the cause."""
    c = Eagle3Config(**dict(BASE, draft_vocab_size=BASE["vocab_size"]))
    names = sorted(export_tensors("vllm", Eagle3DraftModel(c).checkpoint_state(), None, "auto"))
    problems = name_problems("vllm", build_config("vllm", c), names, table_mapper, "t")
    assert len(problems) == 1 and problems[0].startswith(
        "d2t: vLLM's loader (t) maps it to draft_id_to_target_id, which the "
        "LlamaForCausalLMEagle3")
    assert "the draft vocabulary is the whole vocabulary" in problems[0]
