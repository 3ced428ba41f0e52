"""Fixtures of the kind tests: the 6-layer tiny verifier of tests/export and tests/eval (its
directory carries the SmolLM2 tokenizer, so every stage's ``run()`` can load it), and the train
tests' in-memory corpus and hidden-state source over it."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for sub in ("export", "train", "eval"):
    sys.path.insert(0, str(HERE.parent / sub))
sys.path.insert(0, str(HERE))

from conftest_shared import *  # noqa: E402,F401,F403
