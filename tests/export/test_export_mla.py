"""``specdraft export --format vllm`` of the MLA drafter (Kimi-K2.5-shaped verifier,
``tests/kimi_fixture.py``): the written checkpoint is exactly the layout vLLM serves in
``tests/engine/test_kimi_mla_drafter.py`` (:func:`specdraft.models.eagle3_mla.vllm_checkpoint`),
it reads back as the same drafter, and what vLLM cannot serve is refused before a byte is written.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kimi_fixture import kimi_config  # noqa: E402

from specdraft.artifacts.drafter import build_model, read_drafter  # noqa: E402
from specdraft.artifacts.validate import ExportRefused  # noqa: E402
from specdraft.core.profile import resolve_profile  # noqa: E402
from specdraft.export.config import ExportConfig  # noqa: E402
from specdraft.export.run import run as export  # noqa: E402
from specdraft.models.eagle3_mla import (Eagle3MLAConfig, Eagle3MLADraftModel,  # noqa: E402
                                         vllm_checkpoint)
from specdraft.models.io import save_drafter  # noqa: E402

VOCAB, K, AUX = 1024, 200, (1, 2, 3)


def random_mla_drafter(verifier) -> Eagle3MLADraftModel:
    """A random MLA drafter shaped from ``verifier``'s profile (aux ids :data:`AUX`), its
    embedding the verifier's, draft id i -> target 4i."""
    c = Eagle3MLAConfig.from_profile(resolve_profile(verifier.config), draft_vocab_size=K,
                                     aux_layer_ids=AUX)
    drafter = Eagle3MLADraftModel(c).eval()
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(verifier.get_input_embeddings().weight)
        drafter.d2t.copy_(torch.arange(K) * 4 - torch.arange(K))
        drafter.t2d.zero_()
        drafter.t2d[torch.arange(K) * 4] = True
    return drafter


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    """(verifier dir, drafter dir, the drafter): a random MLA drafter shaped from the verifier's
    profile, its embedding the verifier's, a valid vocab map."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("kimi_export")
    torch.manual_seed(0)
    verifier = AutoModelForCausalLM.from_config(kimi_config(VOCAB)).eval()
    verifier.save_pretrained(root / "verifier")
    drafter = random_mla_drafter(verifier)
    save_drafter(drafter, root / "drafter")
    return root, drafter


def test_export_writes_the_layout_vllm_serves(kimi, tmp_path):
    root, drafter = kimi
    out = tmp_path / "vllm"
    export(ExportConfig(drafter=root / "drafter", out=out, format="vllm",
                        verifier=str(root / "verifier"), aux_layers=AUX))
    want_cfg, want_tensors = vllm_checkpoint(drafter)
    assert json.loads((out / "config.json").read_text()) == want_cfg
    got = load_file(str(out / "model.safetensors"))
    assert sorted(got) == sorted(want_tensors) and "t2d" not in got
    for name, t in want_tensors.items():
        assert torch.equal(got[name], t), name
    assert want_cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert (want_cfg["kv_lora_rank"], want_cfg["qk_rope_head_dim"]) == (512, 64)


def test_the_export_reads_back_as_the_same_drafter(kimi, tmp_path):
    root, drafter = kimi
    out = tmp_path / "vllm"
    export(ExportConfig(drafter=root / "drafter", out=out, format="vllm",
                        verifier=str(root / "verifier"), aux_layers=AUX))
    back = read_drafter(out)
    # what the engine reads: the export carries no verifier profile (provenance.json does)
    assert back.format == "vllm" and back.config == replace(drafter.config, verifier_profile=None)
    model = build_model(back)
    assert isinstance(model, Eagle3MLADraftModel)
    for name, t in drafter.state_dict().items():  # t2d rebuilt from d2t
        assert torch.equal(model.state_dict()[name], t), name
    own = read_drafter(root / "drafter")  # specdraft's own directory reads too
    assert own.format == "specdraft" and own.config == drafter.config


def test_other_formats_are_refused_naming_vllm(kimi, tmp_path):
    root, _ = kimi
    for fmt in ("sglang", "speculators"):
        with pytest.raises(ExportRefused, match="served by vLLM only .* --format vllm"):
            export(ExportConfig(drafter=root / "drafter", out=tmp_path / fmt, format=fmt,
                                verifier=str(root / "verifier"), aux_layers=AUX))
        assert not (tmp_path / fmt).exists()


def test_a_wrong_latent_layout_is_refused(kimi, tmp_path):
    """Planted: kv_b_proj stored transposed (a wrong reading of the layout); refused by name,
    nothing written."""
    root, drafter = kimi
    bad = Eagle3MLADraftModel(drafter.config)
    bad.load_state_dict(drafter.state_dict())
    w = bad.midlayer.self_attn.kv_b_proj.weight
    bad.midlayer.self_attn.kv_b_proj.weight = torch.nn.Parameter(w.detach().T.contiguous())
    save_drafter(bad, tmp_path / "bad")
    with pytest.raises(ExportRefused, match="kv_b_proj.weight: shape"):
        export(ExportConfig(drafter=tmp_path / "bad", out=tmp_path / "out", format="vllm",
                            verifier=str(root / "verifier"), aux_layers=AUX))
    assert not (tmp_path / "out").exists()


def test_doctor_checks_the_mla_export(tmp_path, think_tokenizer_dir):
    """``specdraft doctor`` on the MLA export (a verifier with a tokenizer: the think tokenizer
    at vocab 49,154): every check runs; the one that fails is the draft vocabulary missing EOS
    (this random map has none), and the aux ids are read as vLLM reads them (no SGLang reading:
    SGLang does not serve this layer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdraft.artifacts.checks import check_drafter

    tok = AutoTokenizer.from_pretrained(think_tokenizer_dir)
    torch.manual_seed(0)
    verifier = AutoModelForCausalLM.from_config(kimi_config(len(tok))).eval()
    verifier.save_pretrained(tmp_path / "verifier")
    tok.save_pretrained(tmp_path / "verifier")
    drafter = random_mla_drafter(verifier)
    save_drafter(drafter, tmp_path / "drafter")
    export(ExportConfig(drafter=tmp_path / "drafter", out=tmp_path / "vllm", format="vllm",
                        verifier=str(tmp_path / "verifier"), aux_layers=AUX))
    report = check_drafter(tmp_path / "vllm", str(tmp_path / "verifier"), verifier=verifier)
    failed = {ch["name"]: ch["detail"] for ch in report["checks"] if not ch["ok"]}
    assert report["format"] == "vllm"
    assert list(failed) == ["d2t/t2d present and sane, draft vocab coverage"], failed
    assert "EOS" in next(iter(failed.values()))
    aux = next(ch for ch in report["checks"] if ch["name"].startswith("aux ids"))
    assert aux["detail"] == f"hidden_states {list(AUX)} for every engine"


@pytest.mark.parametrize("field,value,named", [
    ("kv_lora_rank", 256, "kv_lora_rank is 256, the verifier's 512"),
    ("qk_rope_head_dim", 32, "qk_rope_head_dim is 32, the verifier's 64"),
    ("rope_theta", 10000.0, "rope is"),
])
def test_mla_widths_or_rope_unlike_the_verifiers_are_refused(kimi, tmp_path, field, value, named):
    """An MLA drafter shaped for another verifier (its latent or rope widths, or its rotary,
    not the verifier's; its recorded profile dropped, as an edited or foreign drafter has):
    refused naming the field and both values, before anything is written."""
    root, drafter = kimi
    changes = {field: value, "verifier_profile": None}
    if field == "qk_rope_head_dim":
        changes["head_dim"] = drafter.config.qk_nope_head_dim + value
    other = Eagle3MLADraftModel(replace(drafter.config, **changes)).eval()
    with torch.no_grad():
        other.embed_tokens.weight.copy_(drafter.embed_tokens.weight)
        other.d2t.copy_(drafter.d2t)
        other.t2d.copy_(drafter.t2d)
    save_drafter(other, tmp_path / "other")
    with pytest.raises(ExportRefused, match=named) as err:
        export(ExportConfig(drafter=tmp_path / "other", out=tmp_path / "out", format="vllm",
                            verifier=str(root / "verifier"), aux_layers=AUX))
    assert "retrain it (train --drafter-layer mla)" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_verifier_with_its_own_code_needs_the_flag(kimi, tmp_path):
    """Kimi's checkpoints ship their own code (``auto_map``; ``model_type`` ``kimi_k2``, which
    transformers does not know): ``export --verifier`` refuses such a verifier naming
    ``--trust-remote-code`` before its code runs, and with the flag reads it (here a subclass of
    transformers' DeepSeek-V3 in the verifier directory) and exports."""
    import shutil

    from specdraft.core.errors import ConfigError

    root, _ = kimi
    remote = tmp_path / "remote"
    shutil.copytree(root / "verifier", remote)
    marker = tmp_path / "ran.txt"
    (remote / "custom.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import DeepseekV3Config, DeepseekV3ForCausalLM\n"
        "class CustomConfig(DeepseekV3Config):\n    model_type = 'kimi_k2'\n"
        "class CustomForCausalLM(DeepseekV3ForCausalLM):\n    config_class = CustomConfig\n")
    cfg = json.loads((remote / "config.json").read_text())
    cfg["model_type"] = "kimi_k2"
    cfg["auto_map"] = {"AutoConfig": "custom.CustomConfig",
                       "AutoModelForCausalLM": "custom.CustomForCausalLM"}
    (remote / "config.json").write_text(json.dumps(cfg))
    request = dict(drafter=root / "drafter", format="vllm", verifier=str(remote),
                   aux_layers=AUX)
    with pytest.raises(ConfigError, match="--trust-remote-code"):
        export(ExportConfig(out=tmp_path / "refused", **request))
    assert not marker.exists() and not (tmp_path / "refused").exists()
    from specdraft.core.verifier import load_verifier

    verifier = load_verifier(remote, trust_remote_code=True)  # a drafter shaped for it
    assert marker.exists()  # its code ran, as asked
    save_drafter(random_mla_drafter(verifier), tmp_path / "drafter")
    export(ExportConfig(out=tmp_path / "out", trust_remote_code=True,
                        **{**request, "drafter": tmp_path / "drafter"}))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == [
        "Eagle3DeepseekV2ForCausalLM"]
