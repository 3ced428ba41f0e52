"""The verifier's weight fingerprint (issue 39, Deliver 1): every tensor contributes, a changed
layer is named, the sampled scheme's limit is what its windows miss and the full scheme sees it,
a copy in another float dtype is a variant only when its values agree within that dtype's
rounding, and a quantized copy whose tensors cannot be compared says so. Each case is planted on
a tiny random Llama saved as safetensors; the expected groups are computed by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft.core.verifier_identity import (STRATA, WINDOW, _safetensors_table, _windows,
                                              compare, identify, identify_like, layer_group)

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def base(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "fp_root_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
    root = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root)
    return root.make_tiny_verifier(tmp_path_factory.mktemp("fp") / "base", smollm2_tokenizer_dir,
                              layers=4, hidden=64)


def _edited(base: Path, dst: Path, edit, *, dtype=None, **config) -> Path:
    """A copy of ``base`` whose tensors went through ``edit(name, tensor) -> tensor`` (then
    ``dtype``), config.json updated with ``config``."""
    shutil.copytree(base, dst)
    state = load_file(str(base / WEIGHTS))
    out = {}
    for k, v in state.items():
        v = edit(k, v.clone())
        out[k] = v.to(dtype) if dtype is not None and v.is_floating_point() else v
    save_file(out, str(dst / WEIGHTS), metadata={"format": "pt"})
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_every_tensor_contributes_and_the_layer_is_named(base, tmp_path):
    ident = identify(base)
    w = ident["weights"]
    assert ident["version"] == 2 and w["scheme"] == "sampled" and w["n_tensors"] == 39
    assert list(w["groups"]) == ["layer 0", "layer 1", "layer 2", "layer 3", "other"]
    table = _safetensors_table(base)
    assert w["bytes_read"] == sum(n for t in table for _, n in _windows(t))
    assert w["bytes_read"] <= 39 * 2 * STRATA * WINDOW
    # the last decoder layer rewritten (x 1.01): that layer and only it is named
    last = _edited(base, tmp_path / "last", lambda k, v: v * 1.01 if ".layers.3." in k else v)
    c = compare(ident, identify(last))
    assert c.kind == "other" and len(c.differences) == 1
    assert "fingerprint of 39 tensors differs in layer 3;" in c.differences[0]
    # one norm gain of layer 1 (a 256-byte tensor, read whole) nudged: layer 1 named
    norm = _edited(base, tmp_path / "norm", lambda k, v: v + 1e-3 if
                   k == "model.layers.1.input_layernorm.weight" else v)
    assert "differs in layer 1;" in compare(ident, identify(norm)).differences[0]


def _outside_windows(t) -> tuple[int, int]:
    """A byte range of ``t`` (relative) of 100 rows' worth that no sampled window touches."""
    cuts = sorted((o - t.start, o - t.start + n) for o, n in _windows(t))
    for (_, end), (nxt, _) in zip(cuts, cuts[1:]):
        if nxt - end > 100 * 64 * 4 + 8:
            return end + 4, end + 4 + 100 * 64 * 4
    raise AssertionError("no gap")


def test_rows_missed_by_every_window_need_the_full_scheme(base, tmp_path):
    name = "model.embed_tokens.weight"  # [49152, 64] float32
    t = next(x for x in _safetensors_table(base) if x.name == name)
    lo, hi = _outside_windows(t)

    def edit(k, v):
        if k == name:
            flat = v.view(-1)
            flat[lo // 4:hi // 4] += 0.5  # 100 rows' worth between two windows
        return v

    tuned = _edited(base, tmp_path / "rows", edit)
    assert compare(identify(base), identify(tuned)).kind == "same"  # the sampled scheme's limit
    full = identify(base, scheme="full")
    assert full["weights"]["bytes_read"] == sum(x.nbytes for x in _safetensors_table(base))
    c = compare(full, identify_like(full, tuned))
    assert c.kind == "other" and "full fingerprint of 39 tensors differs in other;" in \
        c.differences[0]


def test_float_copies_are_variants_only_within_their_rounding(base, tmp_path):
    ident = identify(base)
    bf16 = _edited(base, tmp_path / "bf16", lambda k, v: v, dtype=torch.bfloat16,
                   torch_dtype="bfloat16")
    c = compare(ident, identify(bf16))
    assert c.kind == "variant" and c.weights_checked
    assert "float values agree with the recorded ones" in c.line()
    # a fine-tune of the last layer (x 1.01, beyond bf16's 2^-8 rounding) re-stored in bf16
    tuned = _edited(base, tmp_path / "tuned", lambda k, v: v * 1.01 if ".layers.3." in k else v,
                    dtype=torch.bfloat16, torch_dtype="bfloat16")
    c = compare(ident, identify(tuned))
    assert c.kind == "other"
    assert c.differences == ["weights: float values differ beyond the stored dtypes' rounding "
                             "in layer 3 (served unquantized (stored bfloat16; config says "
                             "float32): a fine-tune stored in another dtype?)"]


def test_a_packed_quantized_copy_is_a_variant_the_probe_must_vouch_for(base, tmp_path):
    def pack(k, v):  # GPTQ-style names: the float weight is gone, int32 qweight in its place
        return v

    q = _edited(base, tmp_path / "gptq", pack, torch_dtype="float16",
                quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 32})
    state = load_file(str(q / WEIGHTS))
    packed = {}
    for k, v in state.items():
        if k.endswith("proj.weight"):
            packed[k[:-len("weight")] + "qweight"] = torch.zeros(v.shape[1] // 8, v.shape[0],
                                                                 dtype=torch.int32)
            packed[k[:-len("weight")] + "scales"] = torch.ones(v.shape[1] // 32, v.shape[0],
                                                               dtype=torch.float16)
        else:
            packed[k] = v.half()
    save_file(packed, str(q / WEIGHTS), metadata={"format": "pt"})
    c = compare(identify(base), identify(q))
    assert c.kind == "variant" and not c.weights_checked
    assert "only the hidden-state probe vouches for it" in c.line()
    # export and eval refuse it unless the flag accepts it (recorded as allowed_by_flag)
    from specdraft.core.verifier_identity import bind

    b = bind(identify(base), str(q), allow_other=False, flag="--allow-x")
    assert b["refusal"].startswith(f"--verifier {q}: a quantized copy (gptq 4-bit, group 32) "
                                   f"of the model the drafter was trained on (unquantized "
                                   f"(float32)) whose weights specdraft cannot compare")
    assert "Pass --allow-x to accept it" in b["refusal"]
    b = bind(identify(base), str(q), allow_other=True, flag="--allow-x")
    assert b["refusal"] is None and b["allowed_by_flag"] and b["kind"] == "variant"


def test_layer_groups_of_hf_and_gguf_names():
    assert layer_group("model.layers.29.mlp.down_proj.weight") == "layer 29"
    assert layer_group("blk.3.attn_q.weight") == "layer 3"
    assert layer_group("model.embed_tokens.weight") == "other"
    assert layer_group("lm_head.weight") == "other"


def test_a_version_1_record_is_compared_with_the_version_1_scheme(base):
    v1 = identify(base, scheme="v1")
    assert v1["version"] == 1 and "sampled" in v1["weights"]
    assert compare(v1, identify_like(v1, base)).kind == "same"
    # a v1 record against a v2 one: everything but the weights, said
    c = compare(v1, identify(base))
    assert c.kind == "same" and not c.weights_checked and "weights not compared" in c.line()


def test_extract_records_the_full_fingerprint_when_asked(base, tmp_path):
    """``extract --verifier-fingerprint full`` records ``scheme: full`` (every byte read), which
    the later checks compare like with like: rows changed outside every sampled window are
    refused by name, while the default sampled record lets them through (its stated limit)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "extract"))
    from extract_helpers import random_rows, write_prepared

    from specdraft.core.manifest import load_stage_manifest
    from specdraft.core.verifier_identity import bind
    from specdraft.extract.config import ExtractConfig
    from specdraft.extract.run import run as extract

    name = "model.embed_tokens.weight"
    t = next(x for x in _safetensors_table(base) if x.name == name)
    lo, hi = _outside_windows(t)

    def edit(k, v):
        if k == name:
            v.view(-1)[lo // 4:hi // 4] += 0.5
        return v

    tuned = _edited(base, tmp_path / "rows", edit)
    records = {}
    for scheme in ("sampled", "full"):
        run = tmp_path / scheme
        write_prepared(run, *random_rows([12, 10], vocab=2000, seed=0))
        extract(ExtractConfig(run_dir=run, verifier=str(base), aux_layers=(1, 2, 3),
                              batch_tokens=128, verifier_fingerprint=scheme))
        records[scheme] = load_stage_manifest(run / "extract").verifier_identity
    full = records["full"]["weights"]
    assert full["scheme"] == "full"
    assert full["bytes_read"] == sum(x.nbytes for x in _safetensors_table(base))
    assert records["sampled"]["weights"]["scheme"] == "sampled"
    assert bind(records["sampled"], str(tuned), allow_other=False, flag="--x")["kind"] == "same"
    b = bind(records["full"], str(tuned), allow_other=False, flag="--x")
    assert b["kind"] == "other" and "full fingerprint of 39 tensors differs in other;" in \
        b["refusal"]
    # train carries extract's full record into the drafter, not the run's sampled contract
    from types import SimpleNamespace

    from specdraft.train.run import verifier_identity as trained_on

    cfg = SimpleNamespace(run_dir=tmp_path / "full", verifier=str(base))
    assert trained_on(cfg, load_stage_manifest(tmp_path / "full" / "extract")) == \
        records["full"]
    cfg = SimpleNamespace(run_dir=tmp_path / "sampled", verifier=str(base))
    assert trained_on(cfg, load_stage_manifest(tmp_path / "sampled" / "extract"))[
        "weights"]["scheme"] == "sampled"


@pytest.mark.slow
def test_a_gguf_is_a_variant_only_when_its_dequantized_values_agree(tmp_path):
    """The shipped SmolLM2 Q4_1 GGUF against its own HF conversion (the dequantized floats,
    ``engines.verifier_dir.gguf_to_hf_dir``): a variant whose values were compared, both ways
    (GGUF names mapped to HF's, llama.cpp's q/k row permutation undone, rows dequantized by
    gguf-py). The conversion with its last layer's tensors x 1.5, or layer 29's q_proj replaced
    by layer 28's, is another model, the layer named; so is the last layer x 1.01, by its
    float norm gains; its 4-bit weights alone x 1.01 stay within their grid step (measured),
    left to the probe."""
    from safetensors.torch import load_file, save_file

    from specdraft.core.verifier import resolve_verifier
    from specdraft.core.verifier_identity import gguf_values
    from specdraft.engines.verifier_dir import gguf_to_hf_dir

    directory, name = resolve_verifier("smollm2")
    hf = gguf_to_hf_dir(Path(directory) / name, tmp_path / "hf")
    g, h = identify("smollm2"), identify(hf)
    assert len(g["weights"]["values"]) == 272 == len(h["weights"]["values"])
    kind, vals, tols = g["weights"]["values"]["model.layers.3.self_attn.q_proj.weight"]
    assert kind == "Q4_1" and len(vals) == 4 and all(0 < t < 0.5 for t in tols)
    for a, b in ((h, g), (g, h)):
        c = compare(a, b)
        assert c.kind == "variant" and c.weights_checked and c.requantized
        assert "a GGUF's dequantized values within one step" in c.line()
    state = load_file(str(hf / WEIGHTS))

    def planted(dst, edit):  # one 0.5 GB float copy at a time: deleted once compared
        shutil.copytree(hf, dst, ignore=shutil.ignore_patterns(WEIGHTS))
        save_file({k: edit(k, v) for k, v in state.items()}, str(dst / WEIGHTS),
                  metadata={"format": "pt"})
        try:
            return compare(g, identify(dst))
        finally:
            shutil.rmtree(dst)

    c = planted(tmp_path / "x15", lambda k, v: v * 1.5 if ".layers.29." in k else v)
    assert c.kind == "other" and "values differ beyond the stored dtypes' rounding in " \
        "layer 29 (" in c.differences[0]
    q28 = state["model.layers.28.self_attn.q_proj.weight"]
    c = planted(tmp_path / "swap", lambda k, v: q28.clone() if
                k.endswith("29.self_attn.q_proj.weight") else v)
    assert c.kind == "other" and "in layer 29 (" in c.differences[0]
    # x 1.01: caught by the layer's float (F32 in the GGUF) norm gains, not by its 4-bit
    # weights, whose 1 % moves stay within a grid step
    c = planted(tmp_path / "x101", lambda k, v: v * 1.01 if ".layers.29." in k else v)
    assert c.kind == "other" and "in layer 29 (" in c.differences[0]
    assert planted(tmp_path / "x101p", lambda k, v: v * 1.01 if ".layers.29." in k and
                   k.endswith("proj.weight") else v).kind == "variant"
    # the permutation undone is what makes q/k comparable: without it they differ
    import specdraft.core.verifier_identity as vi

    from gguf import GGUFReader

    original = vi._unpermuted_row
    try:
        vi._unpermuted_row = lambda reader, hf_name, row: row
        raw = gguf_values(GGUFReader(str(Path(directory) / name)))
    finally:
        vi._unpermuted_row = original
    moved = {"weights": {"values": raw}}
    bad, comparable = vi.value_differences(h["weights"], moved["weights"])
    assert comparable and len(bad) == 30  # every layer's q/k
