"""Session fixtures shared by tests/export, tests/eval and tests/doctor (imported by their
conftest files): a 6-layer tiny verifier directory and the loaded model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def root_conftest():
    """The repository's ``tests/conftest.py`` as a module (for ``make_tiny_verifier``)."""
    path = Path(__file__).resolve().parents[1] / "conftest.py"
    spec = importlib.util.spec_from_file_location("specdraft_root_conftest", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def six_layer_verifier_dir(tmp_path_factory, smollm2_tokenizer_dir):
    return root_conftest().make_tiny_verifier(tmp_path_factory.mktemp("verifier6"), smollm2_tokenizer_dir,
                              layers=6, hidden=64, heads=4, kv_heads=2, seed=1)


@pytest.fixture(scope="session")
def six_layer_verifier(six_layer_verifier_dir):
    from specdraft.core.verifier import load_verifier

    return load_verifier(six_layer_verifier_dir, dtype="float32")
