"""The one rule for a test whose prerequisite is absent (issue #39 item 3): skipped on a
developer's machine, a failure under CI (environment variable ``CI`` set), the message naming
the prerequisite and how to provide it. Importable from every test folder (tests/ is on
sys.path through tests/conftest.py); ``tests/architecture/test_test_paths.py`` checks that
every skip in tests/ goes through here or is one of its listed, deliberate exceptions."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import pytest


def missing(what: str, how: str) -> NoReturn:
    """Skip the test for the absent prerequisite ``what`` (``how``: the way to provide it);
    under CI, fail with the same words instead: CI must run every test."""
    if os.environ.get("CI"):
        pytest.fail(f"{what}: CI must provide it ({how})", pytrace=False)
    pytest.skip(f"{what} ({how})")


def speculators_python_or_skip() -> Path:
    """Python of ``REPO/.venv-speculators`` (speculators 0.9.0), built when missing by the one
    recipe of ``benchmarks/peer_data.py`` (``peer_data.peer_python``, needs PyPI); :func:`missing`
    when it cannot be built."""
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "benchmarks"))
    import peer_data

    try:
        return peer_data.peer_python(repo)
    except RuntimeError as err:
        missing(f"the speculators venv {repo / '.venv-speculators'} is not there and cannot "
                f"be built: {err}", "network to PyPI, or a venv built by peer_data.peer_python")
