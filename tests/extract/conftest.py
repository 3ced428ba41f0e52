"""Fixtures of the extract tests: the tiny verifier loaded once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model(tiny_verifier_dir):
    """The tiny random verifier in fp32 on CPU, loaded once."""
    from specdraft.core.verifier import load_verifier

    return load_verifier(tiny_verifier_dir, dtype="float32", device="cpu")
