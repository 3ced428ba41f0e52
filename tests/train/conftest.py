"""Fixtures of the train tests: a tiny random Llama verifier (vocab 1024, hidden 64, 4 layers),
a self-distilled repetitive corpus and an in-memory hidden-state source over it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from memsource import VOCAB, MemorySource, greedy_corpus, tiny_llama, write_vocab  # noqa: E402,F401


@pytest.fixture(scope="session")
def verifier():
    return tiny_llama()


@pytest.fixture(scope="session")
def corpus(verifier):
    return greedy_corpus(verifier, 24, vocab_range=VOCAB)


@pytest.fixture(scope="session")
def source(verifier, corpus):
    return MemorySource(verifier, corpus)


@pytest.fixture
def run_dir(tmp_path, corpus):
    write_vocab(tmp_path, corpus, VOCAB)
    return tmp_path
