"""The aux-id convention, one module (:mod:`specdraft.core.conventions`) for extract, train,
export and doctor."""

from __future__ import annotations

import json

import pytest

from specdraft.core.conventions import check_aux_layer_ids, default_aux_layer_ids
from specdraft.core.errors import ConfigError


def test_default_is_the_engines_when_valid_else_spread():
    # vLLM SupportsEagle3.get_eagle3_default_aux_hidden_state_layers: (2, N//2, N-3)
    assert default_aux_layer_ids(32) == [2, 16, 29]
    assert default_aux_layer_ids(7) == [2, 3, 4]
    # shallower: [2, (N+1)//2, N-1] (no id 1: SGLang cannot spell it); N=4 leaves only 1, 2, 3
    assert [default_aux_layer_ids(n) for n in (4, 5, 6)] == [[1, 2, 3], [2, 3, 4], [2, 3, 5]]
    for n in range(4, 80):
        check_aux_layer_ids(default_aux_layer_ids(n), n, source="default")  # always valid


def test_too_shallow_names_the_layer_count_and_the_flag():
    with pytest.raises(ConfigError) as err:
        default_aux_layer_ids(3)
    assert "3 decoder layers" in str(err.value) and "--aux-layers" in str(err.value)
    assert "ids 1..2" in str(err.value)


@pytest.mark.parametrize("ids,fragment", [
    ([0, 1, 2], "outside [1, 5]"), ([1, 2, 6], "ids [6] are outside"), ([2, 2, 3], "duplicate"),
    ([3, 1, 2], "must increase"), ([], "empty"), ([1.0, 2, 3], "integers"),
    ("1,2,3", "expected a list")])
def test_check_refuses_naming_the_source(ids, fragment):
    with pytest.raises(ConfigError) as err:
        check_aux_layer_ids(ids, 6, source="--aux-layers")
    assert str(err.value).startswith("--aux-layers") and fragment in str(err.value)


@pytest.mark.slow
def test_extract_on_a_four_layer_verifier_uses_the_documented_default(tmp_path, cli,
                                                                      tiny_verifier_dir):
    from test_write_faults import _extract_run

    run = _extract_run(tmp_path, "run")
    res = cli("extract", "--run-dir", run, "--verifier", tiny_verifier_dir, "--device", "cpu",
              "--storage", "bf16")
    assert res.code == 0, res.err
    manifest = json.loads((run / "extract/manifest.json").read_text())
    assert manifest["aux_layer_ids"] == [1, 2, 3] and manifest["n_layers"] == 4


def test_doctor_and_export_use_the_same_range():
    """id N (after the final norm in HF, before it in the engines) is refused by both."""
    from specdraft.artifacts.validate import check_aux_ids as export_check
    from specdraft.models.eagle3 import Eagle3Config

    c = Eagle3Config(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                     intermediate_size=16, rms_norm_eps=1e-5, rope_theta=1e4,
                     max_position_embeddings=64, vocab_size=40, draft_vocab_size=10,
                     target_hidden_size=8, aux_layer_ids=(2, 3, 6))
    cfg = {"eagle_aux_hidden_state_layer_ids": [2, 3, 6]}
    problems = export_check("vllm", cfg, c, [2, 3, 6], 6)
    assert any("ids [6] are outside [1, 5]" in p for p in problems), problems
