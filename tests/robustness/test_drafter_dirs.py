"""Drafter directories, as `specdraft export --drafter`, `specdraft eval --drafter` and
`specdraft doctor` read them (:func:`specdraft.artifacts.drafter.read_drafter`): a specdraft drafter
(``drafter_config.json`` + ``drafter.safetensors``) or an engine export (``config.json`` +
``model.safetensors``)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from specdraft.artifacts.formats import build_config
from specdraft.artifacts.export import export_tensors
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel
from specdraft.models.io import CONFIG_FILE, WEIGHTS_FILE, save_drafter

FILES = {"specdraft": (CONFIG_FILE, WEIGHTS_FILE), "vllm": ("config.json", "model.safetensors")}


def _tiny() -> Eagle3DraftModel:
    c = Eagle3Config(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                     intermediate_size=16, rms_norm_eps=1e-5, rope_theta=1e4,
                     max_position_embeddings=64, vocab_size=40, draft_vocab_size=10,
                     target_hidden_size=8, aux_layer_ids=(1, 2, 3))
    torch.manual_seed(0)
    m = Eagle3DraftModel(c)
    ids = torch.arange(0, 40, 4)
    m.d2t.copy_(ids - torch.arange(10))
    m.t2d.zero_()
    m.t2d[ids] = True
    return m


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    """A valid drafter directory per format."""
    root = tmp_path_factory.mktemp("drafters")
    m = _tiny()
    save_drafter(m, root / "specdraft")
    out = root / "vllm"
    out.mkdir()
    cfg = build_config("vllm", m.config, verifier_name="", verifier_architectures=[],
                       speculative_tokens=3)
    (out / "config.json").write_text(json.dumps(cfg))
    save_file(export_tensors("vllm", m.checkpoint_state(include_embed=True), None, "auto"),
              str(out / "model.safetensors"))
    return root


def _edit_config(fn):
    def apply(d, fmt):
        path = d / FILES[fmt][0]
        cfg = json.loads(path.read_text())
        layer = cfg.get("transformer_layer_config", cfg)
        fn(layer)
        path.write_text(json.dumps(cfg))
    return apply


def _bytes(fn):
    def apply(d, fmt):
        path = d / FILES[fmt][0]
        path.write_bytes(fn(path.read_bytes()))
    return apply


def _cut_weights(d, fmt):
    path = d / FILES[fmt][1]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _cut_header(d, fmt):
    path = d / FILES[fmt][1]
    path.write_bytes(path.read_bytes()[:6])


def _rm(i):
    return lambda d, fmt: (d / FILES[fmt][i]).unlink()


def _empty(d, fmt):
    for f in d.iterdir():
        f.unlink()


def _rename(old, new):
    return _edit_config(lambda c: c.__setitem__(new, c.pop(old)))


# (case, damage(dir, fmt), what the error must name: {cfg} / {w} = the config / weights file)
CASES = [
    ("config_not_json", _bytes(lambda b: b[: len(b) // 2]), ["{cfg}:", "not valid JSON"]),
    ("config_invalid_utf8", _bytes(lambda b: b.replace(b"{", b'{"x": "\xff",', 1)),
     ["{cfg}:1", "not UTF-8"]),
    ("config_not_object", _bytes(lambda b: b"[" + b + b"]"), ["{cfg}", "expected a JSON object"]),
    ("config_empty", _bytes(lambda b: b""), ["{cfg}:1", "not valid JSON"]),
    ("key_missing", _edit_config(lambda c: c.pop("hidden_size")), ["{cfg}", "hidden_size"]),
    ("key_renamed", _rename("intermediate_size", "ffn_size"), ["{cfg}", "intermediate_size"]),
    ("key_wrong_type", _edit_config(lambda c: c.__setitem__("hidden_size", "8")),
     ["{cfg}", "'hidden_size' must be int, got str"]),
    ("weights_cut_short", _cut_weights, ["{w}", "cut short or corrupt"]),
    ("weights_header_cut", _cut_header, ["{w}", "cut short or corrupt"]),
    ("weights_missing", _rm(1), ["{w}", "not found"]),
    ("directory_empty", _empty, ["neither a specdraft drafter"]),
]
IDS = [c[0] for c in CASES]


def _damaged(tmp_path, drafters, fmt, damage):
    d = tmp_path / fmt
    shutil.copytree(drafters / fmt, d)
    damage(d, fmt)
    return d


def _names(needles, d, fmt):
    return [n.format(cfg=d / FILES[fmt][0], w=d / FILES[fmt][1]) for n in needles]


@pytest.mark.parametrize("fmt", ["specdraft", "vllm"])
@pytest.mark.parametrize("case,damage,needles", CASES, ids=IDS)
def test_export_drafter_refused(tmp_path, cli, drafters, fmt, case, damage, needles):
    d = _damaged(tmp_path, drafters, fmt, damage)
    err = cli("export", "--drafter", d, "--out", tmp_path / "out", "--format", "vllm").error
    assert all(n in err for n in _names(needles, d, fmt)), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["specdraft", "vllm"])
@pytest.mark.parametrize("case,damage,needles", CASES, ids=IDS)
def test_doctor_drafter_refused(tmp_path, cli, drafters, fmt, case, damage, needles):
    d = _damaged(tmp_path, drafters, fmt, damage)
    err = cli("doctor", d, "--verifier", tmp_path / "never-loaded").error
    assert all(n in err for n in _names(needles, d, fmt)), err


@pytest.mark.parametrize("case,damage,needles", CASES, ids=IDS)
def test_eval_drafter_refused(tmp_path, cli, drafters, tiny_verifier_dir, case, damage,
                              needles):
    d = _damaged(tmp_path, drafters, "vllm", damage)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"question": "hi"}\n')
    err = cli("eval", "--drafter", d, "--prompts", prompts, "--verifier", tiny_verifier_dir,
              "--out", tmp_path / "out", "--max-new-tokens", "4").error
    assert all(n in err for n in _names(needles, d, "vllm")), err
    assert not (tmp_path / "out" / "results.json").exists()


def test_valid_drafters_read_back(drafters):
    from specdraft.artifacts.drafter import read_drafter

    for fmt in FILES:
        d = read_drafter(drafters / fmt)
        assert d.config.aux_layer_ids == (1, 2, 3) and d.state["fc.weight"].shape == (8, 24)
