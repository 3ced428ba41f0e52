"""Run-dir artifacts written by an earlier stage and read by a later one (manifests, the
extraction facts export checks against, samples.jsonl, the trained drafter): missing or damaged
pieces are named, and exports are refused, never guessed, when a fact to check them is missing."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from malformed import final_names, write_lines
from specdraft.core.config import StageConfig
from specdraft.core.manifest import StageClock, write_manifest
from stubs import write_stub_manifest
from specdraft.models.io import save_drafter
from test_drafter_dirs import _tiny


class Upstream(StageConfig):
    verifier: str = "tiny"


def make_run(run, *, extract: dict | None = None, head: bool = True):
    """RUN/extract (manifest + verifier head) and RUN/train (manifest + best/) for a tiny
    drafter with aux ids (1, 2, 3) on a 6-layer verifier."""
    m = _tiny()
    ex = run / "extract"
    ex.mkdir(parents=True)
    if head:
        save_file({"embed_tokens.weight": m.embed_tokens.weight.detach().clone()},
                  str(ex / "verifier_head.safetensors"))
    facts = {"aux_layer_ids": [1, 2, 3], "n_layers": 6} if extract is None else extract
    write_manifest(ex, stage="extract", config=Upstream(), clock=StageClock(),
                   extra={"hidden_size": m.config.target_hidden_size,
                          "vocab_size": m.config.vocab_size, "storage": {"format": "bf16"},
                          **facts})
    save_drafter(m, run / "train" / "best")
    write_manifest(run / "train", stage="train", config=Upstream(), clock=StageClock(),
                   extra={"steps": 1, "drafter_config": m.config.to_dict()})
    return run


def _export(cli, run, *extra):
    return cli("export", "--run-dir", run, "--format", "vllm", *extra)


def test_complete_run_exports(tmp_path, cli):
    run = make_run(tmp_path / "run")
    res = _export(cli, run)
    assert res.code == 0, res.err
    cfg = json.loads((run / "export/vllm/config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


# (case, extract manifest facts, head written, what the refusal must name)
MISSING_FACTS = [
    ("no_aux_ids", {"n_layers": 6}, True,
     ["extract/manifest.json has no aux_layer_ids", "--aux-layers 1,2,3"]),
    ("empty_aux_ids", {"aux_layer_ids": [], "n_layers": 6}, True,
     ["has no aux_layer_ids (missing or empty)", "--aux-layers"]),
    ("no_layer_count", {"aux_layer_ids": [1, 2, 3]}, True,
     ["layer count is unknown", "--verifier"]),
    ("no_verifier_embedding", None, False,
     ["verifier's embedding is unknown", "verifier_head.safetensors", "--verifier"]),
]


@pytest.mark.parametrize("case,facts,head,needles", MISSING_FACTS,
                         ids=[c[0] for c in MISSING_FACTS])
def test_export_refused_when_a_fact_is_missing(tmp_path, cli, case, facts, head, needles):
    run = make_run(tmp_path / "run", extract=facts, head=head)
    err = _export(cli, run).error
    assert err.startswith("export refused") or "refused" in err, err
    assert all(n in err for n in needles), err
    assert not (run / "export").exists()


def test_aux_layers_flag_supplies_the_missing_fact(tmp_path, cli):
    run = make_run(tmp_path / "run", extract={"n_layers": 6})
    assert _export(cli, run, "--aux-layers", "1,2,3").code == 0
    wrong = _export(cli, run, "--aux-layers", "1,2,4", "--overwrite").error
    assert "aux ids [1, 2, 3] differ from the ids used at extraction [1, 2, 4]" in wrong


# (case, damage(run), what the error must name; {run} = the run directory)
def _write(rel, data):
    return lambda run: (run / rel).write_bytes(data)


def _cut(rel):
    def go(run):
        p = run / rel
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    return go


def _manifest_edit(fn):
    def go(run):
        p = run / "extract/manifest.json"
        m = json.loads(p.read_text())
        fn(m)
        p.write_text(json.dumps(m))
    return go


DAMAGED = [
    ("manifest_not_json", _cut("extract/manifest.json"),
     ["{run}/extract/manifest.json:", "stage manifest is not valid JSON"]),
    ("manifest_invalid_utf8", _write("extract/manifest.json", b'{"stage": "\xff"}'),
     ["{run}/extract/manifest.json:1", "not UTF-8"]),
    ("manifest_not_object", _write("extract/manifest.json", b"[]"),
     ["{run}/extract/manifest.json", "expected a JSON object"]),
    ("aux_ids_wrong_type", _manifest_edit(lambda m: m.__setitem__("aux_layer_ids", "1,2,3")),
     ["{run}/extract/manifest.json", "key `aux_layer_ids`", "valid list"]),
    ("layer_count_wrong_type", _manifest_edit(lambda m: m.__setitem__("n_layers", "six")),
     ["{run}/extract/manifest.json", "key `n_layers`", "valid integer"]),
    ("drafter_weights_cut", _cut("train/best/drafter.safetensors"),
     ["{run}/train/best/drafter.safetensors", "cut short or corrupt"]),
    ("drafter_config_not_json", _cut("train/best/drafter_config.json"),
     ["{run}/train/best/drafter_config.json:", "not valid JSON"]),
    ("no_trained_drafter", lambda run: shutil.rmtree(run / "train/best"),
     ["{run}/train/best", "not found"]),
]


@pytest.mark.parametrize("case,damage,needles", DAMAGED, ids=[c[0] for c in DAMAGED])
def test_export_names_the_damaged_artifact(tmp_path, cli, case, damage, needles):
    run = make_run(tmp_path / "run")
    damage(run)
    err = _export(cli, run).error
    assert all(n.format(run=run) in err for n in needles), err
    assert not (run / "export" / "vllm").exists()


SAMPLES = [
    ("invalid_utf8", [b'{"id": "a", "messages": "\x80"}'], ["samples.jsonl:1", "not UTF-8"]),
    ("torn_last_line", [{"id": "a", "messages": [], "turns": []}, '{"id": "b", "mess'],
     ["samples.jsonl:2", "not valid JSON"]),
    ("not_object", ["3"], ["samples.jsonl:1", "expected a JSON object, got int"]),
]


@pytest.mark.parametrize("case,lines,needles", SAMPLES, ids=[c[0] for c in SAMPLES])
def test_prepare_names_the_bad_samples_line(tmp_path, cli, smollm2_tokenizer_dir, case, lines,
                                            needles):
    gen = tmp_path / "run" / "generate"
    gen.mkdir(parents=True)
    write_lines(gen / "samples.jsonl", lines)
    write_stub_manifest(gen, "generate")
    err = cli("prepare", "--run-dir", tmp_path / "run", "--tokenizer",
              smollm2_tokenizer_dir).error
    assert all(n in err for n in needles), err
    assert final_names(tmp_path / "run" / "prepare", "prepare") == set()


def test_upstream_stage_not_complete_names_the_command(tmp_path, cli, smollm2_tokenizer_dir):
    err = cli("prepare", "--run-dir", tmp_path / "run", "--tokenizer",
              smollm2_tokenizer_dir).error
    assert "stage `generate` has not completed" in err and "specdraft generate" in err


def test_doctor_on_a_run_with_a_damaged_manifest(tmp_path, cli, tiny_verifier_dir):
    run = make_run(tmp_path / "run")
    _cut("extract/manifest.json")(run)
    err = cli("doctor", run, "--verifier", tiny_verifier_dir).error
    assert f"{run}/extract/manifest.json:" in err and "not valid JSON" in err
