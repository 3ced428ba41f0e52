"""Eval's re-export of a specdraft-format drafter for the engine is checked against the run's own
record (``RUN/extract``'s aux ids), not against the drafter's own ids.

Planted (by hand, undone): ``eval/engine.py`` passing ``drafter.config.aux_layer_ids`` as the
extraction facts again, as it did: ``test_a_drafter_of_other_aux_ids_is_refused`` then fails
(the export compares the ids with themselves and is written).
"""

import json

import pytest

from export_kit import make_drafter, make_run
from specdraft.artifacts.validate import ExportRefused
from specdraft.eval.config import EvalConfig
from specdraft.eval.engine import engine_drafter


def _config(run_dir, verifier_dir, tmp_path):
    return EvalConfig(run_dir=run_dir, verifier=str(verifier_dir), prompts=tmp_path,
                      engine="vllm", out=tmp_path / "out")


def test_a_drafter_of_other_aux_ids_is_refused(tmp_path, six_layer_verifier,
                                              six_layer_verifier_dir):
    """Drafter built on aux ids [2, 3, 4], the run extracted [1, 3, 5]: refused, both named."""
    run_dir = make_run(tmp_path / "run", six_layer_verifier, make_drafter(six_layer_verifier),
                       extract_aux=[1, 3, 5])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ExportRefused, match=r"aux ids \[2, 3, 4\] differ from the ids used at "
                                            r"extraction \[1, 3, 5\]"):
        engine_drafter(_config(run_dir, six_layer_verifier_dir, tmp_path), out)
    assert not (out / "engine-drafter").exists()


def test_the_run_s_drafter_is_exported_with_the_run_s_ids(tmp_path, six_layer_verifier,
                                                         six_layer_verifier_dir):
    """The same drafter on a run that extracted its ids: exported as SGLang's format, ids
    [2, 3, 4] at the top (vLLM) and [1, 2, 3] in ``eagle_config`` (SGLang: first id 2, - 1)."""
    run_dir = make_run(tmp_path / "run", six_layer_verifier, make_drafter(six_layer_verifier))
    out = tmp_path / "out"
    out.mkdir()
    target = engine_drafter(_config(run_dir, six_layer_verifier_dir, tmp_path), out)
    cfg = json.loads((target / "config.json").read_text())
    assert target == out / "engine-drafter"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
