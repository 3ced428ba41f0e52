"""One rule, three readers (:mod:`specdraft.artifacts.rules`): each mismatch is planted once in
a run's drafter and eval (its drafter load), export and doctor all refuse it, by the same words.

Mismatches: EAGLE-3.1's ``norm_before_fc`` flag against ``input_norm.weight`` (both ways), and
aux id N (HF's final boundary, the post-norm state) on an N-layer verifier.
"""

import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from export_kit import make_drafter, make_run  # noqa: E402

from specdraft.artifacts.checks import check_drafter  # noqa: E402
from specdraft.artifacts.validate import ExportRefused  # noqa: E402
from specdraft.core.errors import SpecdraftError  # noqa: E402
from specdraft.eval.config import EvalConfig  # noqa: E402
from specdraft.eval.run import load_drafter_model  # noqa: E402
from specdraft.export.config import ExportConfig  # noqa: E402
from specdraft.export.run import run as export  # noqa: E402


def _flag_without_norm(run: Path) -> None:
    path = run / "train" / "best" / "drafter.safetensors"
    state = load_file(str(path))
    del state["input_norm.weight"]
    save_file(state, str(path))


def _norm_without_flag(run: Path) -> None:
    import torch

    path = run / "train" / "best" / "drafter.safetensors"
    state = load_file(str(path))
    state["input_norm.weight"] = torch.ones(3 * 64)
    save_file(state, str(path))


#: name -> (drafter overrides, the fault planted on disk, the words every reader must say)
MISMATCHES = {
    "norm_before_fc true, input_norm.weight absent": (
        {"norm_before_fc": True}, _flag_without_norm,
        "norm_before_fc is true but input_norm.weight is absent"),
    "norm_before_fc false, input_norm.weight present": (
        {}, _norm_without_flag, "norm_before_fc is false but input_norm.weight is present"),
    "aux id N on an N-layer verifier": (
        {"aux": (2, 3, 6)}, lambda run: None, "ids [6] are outside [1, 5] for this 6-layer"),
}


@pytest.mark.parametrize("name", sorted(MISMATCHES))
def test_eval_export_and_doctor_all_refuse(name, tmp_path, six_layer_verifier,
                                           six_layer_verifier_dir):
    overrides, plant, words = MISMATCHES[name]
    run = make_run(tmp_path / "run", six_layer_verifier,
                   make_drafter(six_layer_verifier, **overrides))
    plant(run)
    # eval: the drafter load every decode starts with
    config = EvalConfig(run_dir=run, prompts="builtin:demo_eval", verifier="unused")
    with pytest.raises(SpecdraftError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_drafter_model(config, six_layer_verifier)
    # export
    with pytest.raises(ExportRefused) as err:
        export(ExportConfig(run_dir=run, format="vllm"))
    assert any(words in p for p in err.value.problems), err.value.problems
    assert not (run / "export").exists()
    # doctor
    report = check_drafter(run, str(six_layer_verifier_dir), verifier=six_layer_verifier)
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert not report["ok"] and any(words in c["detail"] for c in failed), failed


def test_the_clean_drafter_passes_all_three(tmp_path, six_layer_verifier,
                                            six_layer_verifier_dir):
    """The same run unplanted (EAGLE-3.1's norm with its tensor, ids inside [1, N-1]): eval
    loads it, export writes it, doctor's tensor and aux checks pass; the checks with nothing
    to compare against (no RUN/extract rows) say NOT RUN, not PASS."""
    run = make_run(tmp_path / "run", six_layer_verifier,
                   make_drafter(six_layer_verifier, norm_before_fc=True))
    config = EvalConfig(run_dir=run, prompts="builtin:demo_eval", verifier="unused")
    assert load_drafter_model(config, six_layer_verifier).config.norm_before_fc
    export(ExportConfig(run_dir=run, format="vllm"))
    report = check_drafter(run, str(six_layer_verifier_dir), verifier=six_layer_verifier)
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status["tensors are the ones the config describes"] == "pass"
    assert status["aux ids present, right convention per engine"] == "pass"
    assert status["hidden states = the ones the drafter was trained on"] == "not run"
    assert status["stored teacher = the verifier's own distribution, hidden states in band"] \
        == "not run"
