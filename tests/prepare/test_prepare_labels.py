"""The label/mask alignment rule that training uses (specdraft.prepare.labels)."""

import numpy as np
import pytest
import torch

from specdraft.prepare.labels import IGNORE_INDEX, next_token_targets

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
