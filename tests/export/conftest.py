"""Fixtures of the export tests: a 6-layer tiny verifier (so that aux ids 2,3,4 are valid for
every engine) loaded once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest_shared import *  # noqa: E402,F401,F403
