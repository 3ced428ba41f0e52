"""The drafter bound to its verifier (issue #24, Deliver 4).

A tiny random Llama is extracted for real; a drafter carrying its identity is then checked
against: the same model re-saved (same), another random model of the same shapes (refused,
"weights" named), the same weights under another config field (refused, the field named), a
GPTQ-config / bf16 copy (a variant whose values agree within bf16: allowed, said), and the same
model with its hidden basis rotated (QuaRot-style: ``h → hQ``, logits equal within 1e-5)
declared as a quantized variant: its values differ, so the identity refuses it, and the
hidden-state probe catches it as well — in eval, export and doctor. tests/core/test_fingerprint.py
plants the fingerprint's own cases.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from specdraft.core.errors import ConfigError
from specdraft.artifacts.hidden_states import probe_hidden_states
from specdraft.core.verifier_identity import STRATA, WINDOW, bind, compare, identify

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "extract"))
sys.path.insert(0, str(TESTS / "export"))
AUX = (1, 2, 3)


def _root_conftest():
    spec = importlib.util.spec_from_file_location("vb_root_conftest", TESTS / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _load(path: Path):
    from specdraft.core.verifier import load_verifier

    return load_verifier(path, dtype="float32")


def rotate_hidden_basis(model, seed: int = 7):
    """A copy of a Llama ``model`` whose residual stream is ``h Q`` (``Q`` a random orthogonal
    ``[H, H]``), exact because every RMSNorm gain is 1 (random init; ``rms(hQ) = rms(h)``):
    embedding rows ``E Q``; weights reading the residual (q/k/v, gate/up, lm_head) ``W Q``;
    weights writing it (o_proj, down_proj) ``Qᵀ W``. The logits are unchanged."""
    import copy

    for name, p in model.named_parameters():
        if "norm" in name:
            assert torch.equal(p, torch.ones_like(p)), name  # the construction needs gain 1
    H = model.config.hidden_size
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(H, H, generator=g, dtype=torch.float64))
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in out.named_parameters():
            w = p.double()
            if name.endswith(("embed_tokens.weight", "q_proj.weight", "k_proj.weight",
                              "v_proj.weight", "gate_proj.weight", "up_proj.weight",
                              "lm_head.weight")):
                p.copy_((w @ Q).to(p.dtype))
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.copy_((Q.T @ w).to(p.dtype))
            else:
                assert "norm" in name, name
    return out


def _copy_with_config(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _save_like(model, src: Path, dst: Path, *, dtype=torch.float32, **config_changes) -> Path:
    """``model`` saved in ``dtype`` with ``src``'s tokenizer files, config.json updated."""
    model.to(dtype).save_pretrained(dst)
    model.to(torch.float32)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, dst / f.name)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config_changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def world(tmp_path_factory, smollm2_tokenizer_dir):
    """The verifier, its extraction (real, transformers backend), a drafter carrying the
    extract manifest's identity in RUN/train/best, and the other verifiers."""
    from export_kit import make_drafter
    from extract_helpers import random_rows, write_prepared

    from specdraft.core.manifest import load_stage_manifest
    from specdraft.extract.config import ExtractConfig
    from specdraft.extract.run import run as extract
    from specdraft.models.io import save_drafter

    tmp = tmp_path_factory.mktemp("bind")
    make = _root_conftest().make_tiny_verifier
    base = make(tmp / "base", smollm2_tokenizer_dir, layers=4, hidden=64, seed=0)
    model = _load(base)
    run = tmp / "run"
    ids, masks = random_rows([24, 30, 20], vocab=2000, seed=0)
    write_prepared(run, ids, masks)
    extract(ExtractConfig(run_dir=run, verifier=str(base), aux_layers=AUX, storage="bf16",
                          batch_tokens=256))
    identity = load_stage_manifest(run / "extract").verifier_identity
    drafter = make_drafter(model, aux=AUX)
    drafter.config = type(drafter.config).from_dict({**drafter.config.to_dict(),
                                                     "verifier_identity": identity})
    save_drafter(drafter, run / "train" / "best")
    rotated = rotate_hidden_basis(model)
    return {"tmp": tmp, "base": base, "model": model, "run": run, "identity": identity,
            "other": make(tmp / "other", smollm2_tokenizer_dir, layers=4, hidden=64, seed=1),
            "rotated_model": rotated,
            "quarot": _save_like(rotated, base, tmp / "quarot",
                                 quantization_config={"quant_method": "quarot", "bits": 16,
                                                      "rotation": "random-orthogonal"})}


def test_extract_records_the_identity_from_a_few_bytes(world):
    ident = world["identity"]
    assert ident == identify(world["base"])  # deterministic, and what the manifest holds
    assert ident["quantization"] is None and ident["dtype"] == "float32"
    w = ident["weights"]
    assert w["n_tensors"] == 4 * 9 + 3  # 4 layers x (7 linear + 2 norms) + embed, norm, head
    assert w["scheme"] == "sampled" and len(w["groups"]) == 5  # 4 layers + embed/norm/head
    assert w["bytes_read"] <= w["n_tensors"] * 2 * STRATA * WINDOW
    assert ident["config"]["hidden_size"] == 64 and "torch_dtype" not in ident["config"]
    # the drafter carries it (drafter_config.json)
    c = json.loads((world["run"] / "train" / "best" / "drafter_config.json").read_text())
    assert c["verifier_identity"] == ident
    # the model re-saved elsewhere is the same model
    again = _save_like(_load(world["base"]), world["base"], world["tmp"] / "again")
    assert compare(ident, identify(again)).kind == "same"


def test_another_model_of_the_same_shapes_is_refused_naming_what_differs(world, capsys):
    c = compare(world["identity"], identify(world["other"]))
    assert c.kind == "other" and len(c.differences) == 1
    assert c.differences[0].startswith("weights (sampled fingerprint of 39 tensors differs in "
                                       "layer 0, layer 1, layer 2, layer 3, other;")
    b = bind(world["identity"], str(world["other"]), allow_other=False, flag="--allow-x")
    assert "not the model the drafter was trained on" in b["refusal"]
    assert "weights" in b["refusal"] and "--allow-x" in b["refusal"]
    b = bind(world["identity"], str(world["other"]), allow_other=True, flag="--allow-x")
    assert b["refusal"] is None and b["allowed_by_flag"] and b["kind"] == "other"
    assert "[--allow-x]" in capsys.readouterr().err
    # same weights, one config field changed: the field is named with both values
    edited = _copy_with_config(world["base"], world["tmp"] / "edited", rms_norm_eps=1e-5)
    c = compare(world["identity"], identify(edited))
    assert c.kind == "other"
    assert c.differences == ["config fields rms_norm_eps 1e-06 != 1e-05 (trained on != given)"]


def test_a_quantized_variant_is_allowed_with_a_line(world, capsys):
    gptq = _save_like(_load(world["base"]), world["base"], world["tmp"] / "gptq",
                      dtype=torch.bfloat16,
                      quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128})
    b = bind(world["identity"], str(gptq), allow_other=False, flag="--allow-x")
    assert b["kind"] == "variant" and b["refusal"] is None and not b["allowed_by_flag"]
    assert b["served"]["quantization"]["method"] == "gptq"
    assert b["given"] == "gptq 4-bit, group 128" and b["recorded"] == "unquantized (float32)"
    assert b["weights_checked"]  # its bf16 values agree with the float32 ones within 2^-8
    assert "a variant of the model the drafter was trained on (served gptq 4-bit, group 128; " \
           "trained on unquantized (float32)); allowed: same config and tokenizer, its float " \
           "values agree" in capsys.readouterr().err


def test_the_probe_catches_a_rotated_basis_the_logits_hide(world):
    base, rotated = world["model"], world["rotated_model"]
    x = torch.tensor([[1, 50, 400, 7, 1200, 33, 9, 2]])
    with torch.no_grad():
        a, b = base(x).logits, rotated(x).logits
    assert (a - b).abs().max() < 1e-5 and a.abs().max() > 1e-3  # the logits agree
    extract = world["run"] / "extract"
    same = probe_hidden_states(base, extract)
    assert same["ok"] and same["tier"] == "fp32"
    assert max(same["rel_error"].values()) < 1e-3  # a few bf16 flips (batch vs one row)
    assert list(same["cosine"]) == ["1", "2", "3", "final"]
    turned = probe_hidden_states(rotated, extract)
    assert not turned["ok"] and max(abs(v) for v in turned["cosine"].values()) < 0.5
    assert min(turned["rel_error"].values()) > 1.2  # about sqrt(2): uncorrelated states
    assert not probe_hidden_states(rotated, extract, quantized=True)["ok"]  # any tier
    # declared as a quantized variant (QuaRot): its stored values are not the recorded ones
    c = compare(world["identity"], identify(world["quarot"]))
    assert c.kind == "other" and "float values differ" in c.differences[0]


def _scaled_last_layer(model, factor: float = 1.01):
    import copy

    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.model.layers[-1].parameters():
            p.mul_(factor)
    return out


def _rtn4(model, group: int = 64):
    """Every decoder Linear weight rounded to 4 bits, symmetric per group of ``group`` inputs
    (GPTQ/AWQ's storage grid with round-to-nearest: a cruder rounding than GPTQ's)."""
    import copy

    out = copy.deepcopy(model)
    with torch.no_grad():
        for m in out.model.layers.modules():
            if isinstance(m, torch.nn.Linear):
                g = m.weight.reshape(m.weight.shape[0], -1, group)
                scale = g.abs().amax(-1, keepdim=True) / 7
                m.weight.copy_(((g / scale).round().clamp(-8, 7) * scale).reshape(
                    m.weight.shape))
    return out


def test_the_probe_threshold_is_set_by_measured_cases(world):
    """benchmarks/probe_calibration.py's cases on the extracted rows (bf16 storage, fp32
    extraction): a true bf16 copy passes the fp32 tier (relative error 3.7e-3 measured), the
    last layer scaled by 1.01 fails it (1.4e-2: only the final state moves), a 4-bit copy
    fails the fp32 tier and passes the quantized one (its tier when its quantization differs
    from the extracted one's)."""
    from specdraft.artifacts.hidden_states import PROBE_MAX_REL

    extract, base = world["run"] / "extract", world["model"]
    bf16 = probe_hidden_states(base.to(torch.bfloat16).to(torch.float32), extract)
    base.load_state_dict(_load(world["base"]).state_dict())  # undo the rounding
    assert bf16["ok"] and bf16["tier"] == "fp32"
    assert 1e-3 < max(bf16["rel_error"].values()) < 0.5 * PROBE_MAX_REL["fp32"]
    last = probe_hidden_states(_scaled_last_layer(base), extract)
    assert not last["ok"] and last["tier"] == "fp32"
    assert last["rel_error"]["3"] < 1e-3  # hidden_states[3], before the last layer: bf16 flips
    assert 1.2 * PROBE_MAX_REL["fp32"] < last["rel_error"]["final"] < 0.05
    q4 = _rtn4(base)
    assert not probe_hidden_states(q4, extract)["ok"]
    quant = probe_hidden_states(q4, extract, quantized=True)
    assert quant["ok"] and quant["tier"] == "quantized"
    assert 0.05 < max(quant["rel_error"].values()) < 0.5 * PROBE_MAX_REL["quantized"]


def _eval(world, verifier: Path, out: str, **kw):
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import run as evaluate

    prompts = world["tmp"] / "prompts.jsonl"
    prompts.write_text(json.dumps({"question": "What is 2+2?"}) + "\n")
    return evaluate(EvalConfig(run_dir=world["run"], drafter=world["run"] / "train" / "best",
                               out=world["tmp"] / out, prompts=prompts, verifier=str(verifier),
                               k=2, max_new_tokens=3, **kw))


def test_eval_refuses_another_verifier_and_records_the_flag(world):
    with pytest.raises(ConfigError, match=r"not the model the drafter was trained on .*weights"):
        _eval(world, world["other"], "e1")
    _eval(world, world["other"], "e2", allow_other_verifier=True)
    res = json.loads((world["tmp"] / "e2" / "results.json").read_text())
    b = res["verifier_binding"]
    assert b["kind"] == "other" and b["allowed_by_flag"] and "weights" in b["differences"][0]
    assert b["probe"]["ran"] and not b["probe"]["ok"]  # another model's states differ too
    m = json.loads((world["tmp"] / "e2" / "manifest.json").read_text())
    assert m["verifier_binding"]["allowed_by_flag"]


def test_eval_refuses_a_rotated_basis_and_passes_the_true_verifier(world):
    with pytest.raises(ConfigError, match="not the model the drafter was trained on .*float "
                                          "values differ"):
        _eval(world, world["quarot"], "e3")
    _eval(world, world["quarot"], "e3b", allow_other_verifier=True)  # let through: the probe
    b = json.loads((world["tmp"] / "e3b" / "results.json").read_text())["verifier_binding"]
    assert b["probe"]["ran"] and not b["probe"]["ok"]
    _eval(world, world["base"], "e4")
    b = json.loads((world["tmp"] / "e4" / "results.json").read_text())["verifier_binding"]
    assert b["kind"] == "same" and b["probe"]["ok"] and not b["allowed_by_flag"]


def test_export_refuses_another_verifier_and_carries_the_identity(world):
    from specdraft.export.config import ExportConfig
    from specdraft.export.run import run as export
    from specdraft.artifacts.validate import ExportRefused

    common = dict(run_dir=world["run"], format="vllm", aux_layers=AUX)
    with pytest.raises(ExportRefused, match="not the model the drafter was trained on"):
        export(ExportConfig(**common, out=world["tmp"] / "x1", verifier=str(world["other"])))
    m = export(ExportConfig(**common, out=world["tmp"] / "x2", verifier=str(world["other"]),
                            allow_other_verifier=True))
    assert m["verifier_binding"]["allowed_by_flag"]
    prov = json.loads((world["tmp"] / "x2" / "provenance.json").read_text())
    assert prov["verifier_identity"] == world["identity"]
    assert prov["verifier_binding"]["kind"] == "other"


def test_export_runs_the_probe(world, monkeypatch):
    """export --verifier recomputes RUN/extract rows like eval: the true verifier passes (and
    the record says so), the rotated one let through by the flag is recorded as failing, and a
    drafter with no identity (made before identities) exported against the rotated verifier
    is refused by the probe alone; without extract rows the probe says "not run"."""
    from specdraft.export.config import ExportConfig
    from specdraft.export.run import run as export
    from specdraft.artifacts.validate import ExportRefused

    common = dict(format="vllm", aux_layers=AUX)
    m = export(ExportConfig(run_dir=world["run"], **common, out=world["tmp"] / "p1",
                            verifier=str(world["base"])))
    probe = m["verifier_binding"]["probe"]
    assert probe["ran"] and probe["ok"] and probe["tier"] == "fp32"
    m = export(ExportConfig(run_dir=world["run"], **common, out=world["tmp"] / "p2",
                            verifier=str(world["quarot"]), allow_other_verifier=True))
    assert m["verifier_binding"]["probe"]["ran"] and not m["verifier_binding"]["probe"]["ok"]
    # a run whose drafter and extraction carry no identity: only the probe can tell
    old = world["tmp"] / "old_run"
    shutil.copytree(world["run"], old)
    (old / "verifier.json").unlink(missing_ok=True)
    for f in (old / "extract" / "manifest.json", old / "train" / "best" / "drafter_config.json"):
        d = json.loads(f.read_text())
        d["verifier_identity"] = None
        f.write_text(json.dumps(d))
    with pytest.raises(ExportRefused, match="hidden-state probe: .* FAILED"):
        export(ExportConfig(run_dir=old, **common, out=world["tmp"] / "p3",
                            verifier=str(world["quarot"])))
    m = export(ExportConfig(drafter=old / "train" / "best", **common,
                            out=world["tmp"] / "p4", verifier=str(world["base"])))
    assert m["verifier_binding"]["probe"] == {
        "ran": False, "line": "hidden-state probe: not run (no RUN/extract rows (export "
                              "--run-dir of the run that extracted them); only the recorded "
                              "identity was compared)"}
    # a verifier that would not fit in half of the machine's memory in float32 is not loaded
    import os

    monkeypatch.setattr(os, "sysconf", lambda k: 4096 if k == "SC_PAGE_SIZE" else 100)
    m = export(ExportConfig(run_dir=world["run"], **common, out=world["tmp"] / "p5",
                            verifier=str(world["base"])))
    probe = m["verifier_binding"]["probe"]
    assert not probe["ran"] and "GiB of weights would be loaded in float32 on a machine of" in \
        probe["line"]


def test_doctor_fails_the_rotated_verifier_on_identity_and_probe(world):
    from specdraft.doctor.config import DoctorConfig
    from specdraft.doctor.run import run as doctor

    def checks(verifier: Path) -> dict[str, bool]:
        r = doctor(DoctorConfig(target=world["run"], verifier=str(verifier), dtype="float32"))
        return {c["name"]: c["ok"] for c in r["checks"]}

    rotated = checks(world["quarot"])
    assert not rotated["hidden states = the ones the drafter was trained on"]
    assert not rotated["verifier is the model the drafter was trained on"]  # values differ
    true = checks(world["base"])
    assert true["hidden states = the ones the drafter was trained on"]
    assert true["verifier is the model the drafter was trained on"]
    assert not checks(world["other"])["verifier is the model the drafter was trained on"]
