"""Fixtures of the train tests: a tiny random Llama verifier (vocab 1024, hidden 64, 4 layers),
a self-distilled repetitive corpus and an in-memory hidden-state source over it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from memsource import MemorySource, greedy_corpus, write_vocab  # noqa: E402

VOCAB = 1024
SHARPEN = 30.0


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a peaked (confident) teacher, as trained verifiers are
        model.lm_head.weight.mul_(SHARPEN)
    return model


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
