"""Fixtures of the doctor tests (the 6-layer tiny verifier shared with tests/export)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from conftest_shared import *  # noqa: E402,F401,F403
