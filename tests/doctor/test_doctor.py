"""Doctor catches, on a tiny exported drafter, each planted fault in turn."""

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from export_kit import make_drafter, make_run, write_chat_format  # noqa: E402
from specdraft.doctor.config import DoctorConfig  # noqa: E402
from specdraft.doctor.run import run as doctor  # noqa: E402
from specdraft.export.config import ExportConfig  # noqa: E402
from specdraft.export.run import run as export  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory, six_layer_verifier):
    run_dir = make_run(tmp_path_factory.mktemp("doc") / "run", six_layer_verifier,
                       make_drafter(six_layer_verifier))
    export(ExportConfig(run_dir=run_dir, format="sglang"))
    return run_dir / "export" / "sglang"


def failing(path, verifier_dir, verifier):
    r = doctor(DoctorConfig(target=path, verifier=str(verifier_dir)), verifier=verifier)
    return sorted(c["name"] for c in r["checks"] if not c["ok"]), r


def edit_config(d, fn):
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg)
    (d / "config.json").write_text(json.dumps(cfg))


def edit_weights(d, fn):
    w = load_file(str(d / "model.safetensors"))
    fn(w)
    save_file(w, str(d / "model.safetensors"))


FAULTS = {
    "hidden size and vocab match":
        lambda d: edit_config(d, lambda c: c.update(target_hidden_size=32)),
    "aux ids present, right convention per engine":
        lambda d: edit_config(d, lambda c: c["eagle_config"].update(
            eagle_aux_hidden_state_layer_ids=[3, 4, 5])),  # +1 applied twice for SGLang
    "d2t/t2d present and sane, draft vocab coverage":
        lambda d: edit_weights(d, lambda w: w.pop("d2t")),
    "embed_tokens equal to the verifier's":
        lambda d: edit_weights(d, lambda w: w.update(
            {"embed_tokens.weight": torch.randn_like(w["embed_tokens.weight"])})),
    "computation fields explicit and served":
        lambda d: edit_config(d, lambda c: c.pop("norm_before_residual")),
    "max_position_embeddings >= the verifier's":
        lambda d: edit_config(d, lambda c: c.update(max_position_embeddings=512)),
    "tensors are the ones the config describes":
        lambda d: edit_weights(d, lambda w: w.pop("midlayer.mlp.down_proj.weight")),
}
#: a fault that also breaks the tensors' agreement with the config (fc's width follows it)
ALSO = {"hidden size and vocab match": ["tensors are the ones the config describes"]}


def test_clean_export_passes(exported, six_layer_verifier_dir, six_layer_verifier):
    bad, r = failing(exported, six_layer_verifier_dir, six_layer_verifier)
    assert bad == [] and r["ok"] and r["format"] == "sglang" and len(r["checks"]) == 12


@pytest.mark.parametrize("check", sorted(FAULTS))
def test_each_planted_fault_fails_its_check(check, exported, tmp_path, six_layer_verifier_dir,
                                            six_layer_verifier):
    d = tmp_path / "d"
    shutil.copytree(exported, d)
    FAULTS[check](d)
    bad, _ = failing(d, six_layer_verifier_dir, six_layer_verifier)
    assert bad == sorted([check, *ALSO.get(check, [])])


def test_missing_aux_ids_and_eos_outside_draft_vocab(exported, tmp_path,
                                                     six_layer_verifier_dir, six_layer_verifier):
    d = tmp_path / "d"
    shutil.copytree(exported, d)
    edit_config(d, lambda c: c.pop("eagle_aux_hidden_state_layer_ids"))  # vLLM falls back
    bad, r = failing(d, six_layer_verifier_dir, six_layer_verifier)
    assert bad == ["aux ids present, right convention per engine"]

    def drop_eos(w):  # swap EOS (id 2) out of the draft vocab for id 70
        t2d = w["t2d"].clone()
        t2d[2], t2d[70] = False, True
        target = torch.nonzero(t2d).flatten()
        w.update(t2d=t2d, d2t=target - torch.arange(len(target)))
    shutil.copytree(exported, tmp_path / "e")
    edit_weights(tmp_path / "e", drop_eos)
    bad, r = failing(tmp_path / "e", six_layer_verifier_dir, six_layer_verifier)
    assert bad == ["d2t/t2d present and sane, draft vocab coverage"]
    assert "EOS 2 is not in the draft vocab" in [c for c in r["checks"] if not c["ok"]][0]["detail"]


def test_run_dir_template_and_think_tokens(tmp_path, six_layer_verifier, six_layer_verifier_dir):
    from specdraft.core.verifier import load_tokenizer

    tok = load_tokenizer(six_layer_verifier_dir)
    good = hashlib.sha256(tok.chat_template.encode()).hexdigest()
    run_dir = make_run(tmp_path / "run", six_layer_verifier, make_drafter(six_layer_verifier),
                       template_hash=good)
    bad, r = failing(run_dir, six_layer_verifier_dir, six_layer_verifier)
    assert bad == [] and r["drafter"].endswith("train/best") and r["format"] == "specdraft"
    # the template changed since prepare
    make_run(tmp_path / "run2", six_layer_verifier, make_drafter(six_layer_verifier),
             template_hash="0" * 64)
    assert failing(tmp_path / "run2", six_layer_verifier_dir, six_layer_verifier)[0] == \
        ["chat template unchanged since prepare"]
    # think markers that SmolLM2's tokenizer splits into several tokens
    from specdraft.core.chat import ThinkMarkers

    write_chat_format(run_dir, template_hash=good, think=ThinkMarkers(
        opener="<think>", closer="</think>", opener_id=-1, closer_id=-1))
    assert failing(run_dir, six_layer_verifier_dir, six_layer_verifier)[0] == \
        ["think tokens are single tokens"]


def test_cli_exit_code(exported, tmp_path, six_layer_verifier_dir):
    from typer.testing import CliRunner

    from specdraft.cli import app

    ok = CliRunner().invoke(app, ["doctor", str(exported), "--verifier",
                                  str(six_layer_verifier_dir)])
    assert ok.exit_code == 0, ok.output
    d = tmp_path / "d"
    shutil.copytree(exported, d)
    FAULTS["computation fields explicit and served"](d)
    bad = CliRunner().invoke(app, ["doctor", str(d), "--verifier", str(six_layer_verifier_dir)])
    assert bad.exit_code == 1 and "[FAIL] computation fields explicit and served" in bad.output
    assert "fix: re-run `specdraft export`" in bad.output


def test_the_report_names_the_engine_fixes_of_the_runs_eval(exported, six_layer_verifier_dir):
    """A run whose eval figures needed a CPU-engine fix: the doctor report lists it (and the CLI
    prints it as a NOTE); without engine figures, nothing (issue #39, item 2)."""
    from typer.testing import CliRunner

    from specdraft.cli import app

    run_dir = exported.parents[1]
    assert doctor(DoctorConfig(target=run_dir, verifier=str(six_layer_verifier_dir)))[
        "engine_fixes"] == []
    fix = "vLLM CPU build: the expand kernel ... replaced by an exact torch expand"
    (run_dir / "eval").mkdir(exist_ok=True)
    (run_dir / "eval" / "manifest.json").write_text(json.dumps(
        {"stage": "eval", "engine": {"name": "vllm", "engine_fixes": [fix]}}))
    try:
        r = doctor(DoctorConfig(target=run_dir, verifier=str(six_layer_verifier_dir)))
        assert r["engine_fixes"] == [fix]
        out = CliRunner().invoke(app, ["doctor", str(run_dir), "--verifier",
                                       str(six_layer_verifier_dir)]).output
        assert f"[NOTE] the run's engine figures (RUN/eval) needed a fix to the CPU engine: " \
               f"{fix}" in out
    finally:
        shutil.rmtree(run_dir / "eval")
