"""The conventions of specdraft.core.conventions: the supervised-position rule (by hand) and the
d2t/t2d contract."""

import numpy as np
import pytest
import torch

from specdraft.core.conventions import (IGNORE_INDEX, next_token_targets, supervised_positions,
                                        vocab_map_problems)

U1, U2, A1, A2, A3, EOS = 11, 12, 21, 22, 23, 2


def check(fn) -> None:
    """The alignment, by hand: position p predicts token p+1, so positions 1..4 (labels a1, a2,
    a3, eos) are supervised; position 0 (label u2) and the last (no label) are not."""
    ids = torch.tensor([U1, U2, A1, A2, A3, EOS])
    mask = torch.tensor([0, 0, 1, 1, 1, 1], dtype=torch.uint8)
    labels, sup = fn(ids, mask)
    assert sup.tolist() == [False, True, True, True, True, False]
    assert labels[sup].tolist() == [A1, A2, A3, EOS]
    assert labels.tolist()[:5] == [U2, A1, A2, A3, EOS]


def test_alignment():
    check(next_token_targets)
    labels, _ = next_token_targets(torch.tensor([U1, U2, A1, A2, A3, EOS]),
                                   torch.tensor([0, 0, 1, 1, 1, 1]))
    assert labels[-1].item() == IGNORE_INDEX


def test_off_by_one_version_fails():
    def wrong(ids, mask):  # supervises positions 2..5 (the mask itself, not shifted)
        labels = torch.cat([ids[1:], torch.tensor([IGNORE_INDEX])])
        return labels, mask == 1

    with pytest.raises(AssertionError):
        check(wrong)


def test_batched_numpy():
    ids = np.array([[U1, U2, A1, A2, A3, EOS], [U1, A1, A2, EOS, 0, 0]], dtype=np.int32)
    mask = np.array([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]], dtype=np.uint8)
    labels, sup = next_token_targets(ids, mask)
    assert sup.tolist() == [[False, True, True, True, True, False],
                            [True, True, True, False, False, False]]
    assert labels[1].tolist() == [A1, A2, EOS, 0, 0, IGNORE_INDEX]
    assert ids[0].tolist() == [U1, U2, A1, A2, A3, EOS]  # inputs untouched


def test_supervised_positions():
    mask = torch.tensor([0, 0, 1, 1, 0, 1], dtype=torch.uint8)
    assert supervised_positions(mask).tolist() == [1, 2, 4]
    assert supervised_positions(torch.tensor([1], dtype=torch.uint8)).tolist() == []


def test_vocab_map_problems():
    t2d = np.array([False, True, False, True, True])
    assert vocab_map_problems(np.array([1, 2, 2]), t2d) == []           # targets 1, 3, 4
    assert vocab_map_problems(torch.tensor([1, 2, 2]), torch.tensor(t2d), 3, 5) == []
    assert "not strictly increasing" in vocab_map_problems(np.array([3, 0, 2]), t2d)[0]
    assert "leaves [0, 5)" in vocab_map_problems(np.array([1, 2, 3]), t2d)[0]
    assert vocab_map_problems(np.array([1, 2, 2]), ~t2d)[0].startswith("t2d has 2 true")
    assert "disagree" in vocab_map_problems(np.array([0, 2, 2]), t2d)[-1]
    assert "expected [4]" in vocab_map_problems(np.array([1, 2, 2]), t2d, 4, 5)[0]
    assert "absent" in vocab_map_problems(None, t2d)[0]
