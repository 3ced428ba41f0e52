"""Fixtures of the eval tests (the 6-layer tiny verifier shared with tests/export)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from conftest_shared import *  # noqa: E402,F401,F403


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls: one thread is 10-100x faster than two on the shared, loaded cores. A module
    uses it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
