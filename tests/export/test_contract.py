"""The drafter contract (``artifacts/contract.py``): every computation field written in every
format and read back as the engine reads it; configs from other tools read with their fields
honoured or refused by name; exports an engine would misread are refused."""

import json

import pytest
import torch
from safetensors.torch import save_file

from export_kit import make_drafter, make_run
from specdraft.core.errors import InputError
from specdraft.artifacts import contract, formats
from specdraft.export.config import ExportConfig
from specdraft.artifacts.drafter import build_model, read_drafter
from specdraft.export.run import run as export_run
from specdraft.artifacts.validate import ExportRefused
from specdraft.models.eagle3 import COMPUTATION_FIELDS, DraftKVCache

EAGLE31 = {"norm_before_fc": True, "fc_norm": True, "norm_output": True}
QWEN3 = {"draft_layer": "qwen3"}
ALL = {**EAGLE31, **QWEN3, "norm_before_residual": True}


def randomise_norms(m, seed=0):
    """Norm gains 1 + 0.3·N(0, 1): a gain of 1 would hide a skipped or repeated norm."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    return m


def chain(m, n_aux_hidden):
    """Logits of 3 chained draft steps after a 4-column prompt (as the eval drafter runs)."""
    torch.manual_seed(5)
    aux = torch.randn(1, 4, n_aux_hidden)
    cache = DraftKVCache()
    with torch.no_grad():
        out = m.forward_cached(torch.tensor([[3, 4, 5, 6]]), m.fuse_aux(aux),
                               torch.arange(4)[None], cache)[:, -1:]
        logits = [m.logits(out)]
        for j in range(2):
            out = m.forward_cached(torch.tensor([[7 + j]]), m.feedback(out),
                                   torch.tensor([[4 + j]]), cache)
            logits.append(m.logits(out))
    return torch.cat(logits)


def foreign_export(tmp_path, m, cfg):
    """An export directory as another tool writes it: our tensors, the given config.json."""
    out = tmp_path / "foreign"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in m.checkpoint_state(include_embed=True).items()},
              str(out / "model.safetensors"))
    return out


def vllm_style_config(m, **extra):
    """A native config the way vLLM's own docs/tools spell one (no specdraft builder)."""
    c = m.config
    cfg = {"architectures": ["Eagle3LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": c.hidden_size, "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
           "intermediate_size": c.intermediate_size, "rms_norm_eps": c.rms_norm_eps,
           "rope_theta": c.rope_theta, "max_position_embeddings": c.max_position_embeddings,
           "vocab_size": c.vocab_size, "draft_vocab_size": c.draft_vocab_size,
           "target_hidden_size": c.target_hidden_size, "num_hidden_layers": 1,
           "eagle_aux_hidden_state_layer_ids": list(c.aux_layer_ids),
           "transformers_version": "5.0.0", "bos_token_id": 1, "torch_dtype": "float32"}
    cfg.update(extra)
    return cfg


def test_foreign_config_with_norm_output_is_read_and_computed_with_the_norms(
        tmp_path, six_layer_verifier):
    """``norm_output: true`` etc. from another tool: read as such (not as plain EAGLE-3), and
    the rebuilt drafter computes what the in-memory one does (whose function is checked against
    a hand-written reference in tests/models/test_drafters.py); the same tensors read as plain
    EAGLE-3 would compute other logits."""
    m = randomise_norms(make_drafter(six_layer_verifier, **EAGLE31)).eval()
    cfg = vllm_style_config(m, norm_before_fc=True, fc_norm=True, norm_output=True)
    d = read_drafter(foreign_export(tmp_path, m, cfg))
    assert (d.config.norm_before_fc, d.config.fc_norm, d.config.norm_output,
            d.config.norm_before_residual, d.config.draft_layer) == (True, True, True, False,
                                                                      "llama")
    n = m.config.n_aux * m.config.target_hidden_size
    want = chain(m, n)
    torch.testing.assert_close(chain(build_model(d), n), want, atol=0, rtol=0)
    plain = make_drafter(six_layer_verifier)
    plain.load_state_dict(m.state_dict(), strict=False)
    assert (chain(plain.eval(), n) - want).abs().max() > 1e-2


def test_norm_before_fc_in_eagle_config_wins_like_vllm(tmp_path, six_layer_verifier):
    m = randomise_norms(make_drafter(six_layer_verifier, norm_before_fc=True))
    cfg = vllm_style_config(m, norm_before_fc=False,
                            eagle_config={"norm_before_fc": True, "use_aux_hidden_state": True})
    assert read_drafter(foreign_export(tmp_path, m, cfg)).config.norm_before_fc is True


def test_speculators_config_without_norm_before_residual_reads_true(tmp_path,
                                                                    six_layer_verifier):
    """vLLM's speculators loader defaults ``norm_before_residual`` to true (``algos.py``)."""
    m = make_drafter(six_layer_verifier, norm_before_residual=True)
    cfg = formats.build_config("speculators", m.config, verifier_name="v")
    del cfg["norm_before_residual"]
    out = tmp_path / "spec"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg))
    save_file(formats.rename(m.checkpoint_state(), formats.SPECULATORS_RENAME),
              str(out / "model.safetensors"))
    assert read_drafter(out).config.norm_before_residual is True


@pytest.mark.parametrize("extra,named", [
    ({"norm_output_scale": 2.0}, "norm_output_scale=2.0"),
    ({"attention_bias": True}, "attention_bias=True"),
    ({"num_hidden_layers": 2}, "num_hidden_layers=2"),
    ({"logit_scale": 0.5}, "logit_scale=0.5"),
    ({"layer_types": ["sliding_attention"]}, "layer_types="),
    ({"eagle_config": {"use_aux_hidden_state": False}}, "eagle_config.use_aux_hidden_state"),
    ({"architectures": ["Eagle3DeepseekV2ForCausalLM"]}, "Eagle3DeepseekV2ForCausalLM"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"norm_output": "false"}, "norm_output='false': must be true or false"),
])
def test_a_field_specdraft_does_not_implement_is_refused_by_name(tmp_path, six_layer_verifier,
                                                                 extra, named):
    m = make_drafter(six_layer_verifier)
    with pytest.raises(InputError, match="config.json") as err:
        read_drafter(foreign_export(tmp_path, m, vllm_style_config(m, **extra)))
    assert named in str(err.value)


def test_unknown_key_of_a_specdraft_drafter_dir_is_refused_by_name(tmp_path, six_layer_verifier):
    from specdraft.artifacts.drafter import load_drafter
    from specdraft.models.io import save_drafter

    d = save_drafter(make_drafter(six_layer_verifier), tmp_path / "d")
    cfg = json.loads((d / "drafter_config.json").read_text()) | {"norm_output_v2": True}
    (d / "drafter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="norm_output_v2"):
        read_drafter(d)
    with pytest.raises(ValueError, match="norm_output_v2"):  # resume reads with load_drafter
        load_drafter(d)


@pytest.mark.parametrize("fields", [{}, EAGLE31, QWEN3, ALL], ids=["eagle3", "3.1", "qwen3",
                                                                    "all"])
@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_every_field_is_written_and_read_back(tmp_path, six_layer_verifier, fmt, fields):
    """Our export of each variant: every computation field explicit in config.json, the layer's
    class/model_type for vLLM, read back by our strict reader to the trained config."""
    m = make_drafter(six_layer_verifier, **fields)
    run_dir = make_run(tmp_path / "run", six_layer_verifier, m)
    export_run(ExportConfig(run_dir=run_dir, format=fmt))
    out = run_dir / "export" / fmt
    cfg = json.loads((out / "config.json").read_text())
    flat = {**cfg.get("transformer_layer_config", {}), **cfg}
    for name in COMPUTATION_FIELDS[:-1]:
        assert flat[name] is getattr(m.config, name), name
    layer = m.config.draft_layer
    assert flat["model_type"] == layer
    if fmt == "vllm":
        assert cfg["architectures"] == [{"llama": "LlamaForCausalLMEagle3",
                                         "qwen3": "Eagle3Qwen3ForCausalLM"}[layer]]
    back = read_drafter(out).config
    for name in COMPUTATION_FIELDS:
        assert getattr(back, name) == getattr(m.config, name), name


@pytest.mark.parametrize("fields,named", [
    (EAGLE31, ["norm_before_fc", "fc_norm", "norm_output"]), (QWEN3, ["draft_layer"]),
    ({"norm_before_residual": True}, ["norm_before_residual"])])
def test_sglang_export_of_a_field_sglang_ignores_is_refused(tmp_path, six_layer_verifier,
                                                            fields, named):
    m = make_drafter(six_layer_verifier, **fields)
    run_dir = make_run(tmp_path / "run", six_layer_verifier, m)
    with pytest.raises(ExportRefused) as err:
        export_run(ExportConfig(run_dir=run_dir, format="sglang"))
    for name in named:
        assert f"sglang does not read {name}" in str(err.value)
    assert not (run_dir / "export" / "sglang").exists()


def test_planted_omitted_field_is_caught(tmp_path, six_layer_verifier, monkeypatch):
    """A builder that forgets ``norm_output`` (or ``norm_before_residual``): the export is
    refused, naming the field and what vLLM would compute instead."""
    # the speculators loader's differing default, caught on a candidate config directly
    c = make_drafter(six_layer_verifier).config
    cfg = formats.build_config("speculators", c, verifier_name="v")
    assert contract.check_contract("speculators", cfg, c) == []
    del cfg["norm_before_residual"]
    problems = contract.check_contract("speculators", cfg, c)
    assert any("vllm-speculators would compute norm_before_residual=True" in p
               for p in problems)
    m = make_drafter(six_layer_verifier, norm_output=True)
    run_dir = make_run(tmp_path / "run", six_layer_verifier, m)
    real = formats.computation_keys
    monkeypatch.setattr(formats, "computation_keys",
                        lambda c: {k: v for k, v in real(c).items() if k != "norm_output"})
    with pytest.raises(ExportRefused) as err:
        export_run(ExportConfig(run_dir=run_dir, format="vllm"))
    assert "'norm_output' not written explicitly" in str(err.value)
    assert "vllm-native would compute norm_output=False" in str(err.value)


def test_engine_table_matches_the_installed_vllm_source():
    """The defaults of :data:`contract.ENGINE_READS` as vLLM 0.32's source spells them, read
    from the vLLM venv's own ``vllm`` package (located by that venv's python, without importing
    it; a missing venv skips here and fails under CI: :func:`stubs.vllm_python_or_skip`)."""
    import subprocess
    from pathlib import Path

    from stubs import vllm_python_or_skip

    where = subprocess.run(
        [vllm_python_or_skip(), "-c", "import importlib.util as u; "
         "print(u.find_spec('vllm').submodule_search_locations[0])"],
        capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, f"the vLLM venv has no vllm package: {where.stderr[-500:]}"
    site = Path(where.stdout.strip())
    llama = (site / "model_executor/models/llama_eagle3.py").read_text()
    algos = (site / "transformers_utils/configs/speculators/algos.py").read_text()
    for name in ("norm_before_residual", "fc_norm", "norm_before_fc"):
        assert f'getattr(config, "{name}", False)' in llama or \
            f'getattr(self.config, "{name}", False)' in llama, name
        assert contract.ENGINE_READS["vllm-native"][name].value is False
    assert 'getattr(self.config, "norm_output", False)' in llama
    assert '"norm_before_residual", True' in algos
    assert contract.ENGINE_READS["vllm-speculators"]["norm_before_residual"].value is True
    assert '"qwen3": "Eagle3Qwen3ForCausalLM"' in algos


def test_run_summary_offers_sglang_only_for_the_sglang_format():
    """A vllm/speculators export (EAGLE-3.1, Qwen3 layer) gets no SGLang command."""
    from specdraft.engines.serve import serve_commands

    commands = serve_commands("/d", "/v", 3, fmt="sglang")
    assert [c.split()[:3] for c in commands] == [["python", "-m", "vllm.entrypoints.openai."
                                                  "api_server"],
                                                 ["python", "-m", "sglang.launch_server"]]
    for fmt in ("vllm", "speculators"):
        (only,) = serve_commands("/d", "/v", 3, fmt=fmt)
        assert only.startswith("python -m vllm.entrypoints.openai.api_server --model /v "
                               "--dtype float32 --speculative-config") and '"model": "/d"' in only
        assert serve_commands("/d", "/v", 3, topk=4, num_draft_tokens=8, fmt=fmt) == []
