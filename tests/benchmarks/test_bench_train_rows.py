"""bench_train_rows' settings parser (the timing itself is a benchmark: docs/benchmarks.md)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_train_rows import parse_sets  # noqa: E402


def test_settings_are_yaml_values():
    assert parse_sets("") == {}
    assert parse_sets("align_topk=1,lm_head_init=verifier-frozen, lr=0.001") == {
        "align_topk": 1, "lm_head_init": "verifier-frozen", "lr": 0.001}


def test_an_item_without_a_value_is_named():
    with pytest.raises(ValueError, match="'align_topk'"):
        parse_sets("lr=1e-3,align_topk")
