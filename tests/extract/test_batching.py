"""Batch plan, padding and target positions, by hand."""

from __future__ import annotations

import torch

from specdraft.core.batching import (Batch, pad_rows, plan_batches, plan_shards,
                                        rank_batches)


def test_plan_batches_by_hand():
    # sorted longest first: rows 1 (7), 2 (5), 0 (3), 3 (2); budget 10 padded tokens
    assert plan_batches([3, 7, 5, 2], 10) == [Batch((1,), 7), Batch((2, 0), 5), Batch((3,), 2)]
    # a row longer than the budget gets a batch of its own
    assert plan_batches([20, 2], 10) == [Batch((0,), 20), Batch((1,), 2)]
    # ties keep dataset order
    assert plan_batches([4, 4, 4], 8) == [Batch((0, 1), 4), Batch((2,), 4)]


def test_rank_batches_and_shards():
    batches = [Batch((i,), 1) for i in range(5)]
    assert rank_batches(batches, 0, 2) == [batches[0], batches[2], batches[4]]
    assert rank_batches(batches, 1, 2) == [batches[1], batches[3]]
    assert plan_shards([4, 1, 2, 0], [60, 50, 30, 200], 100) == [[4], [1, 2], [0]]


def test_pad_rows_and_targets():
    p = pad_rows([[5, 6, 7], [8]], [[0, 1, 1], [1]])
    assert p.input_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert p.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert p.position_ids.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert p.loss_mask.tolist() == [[0, 1, 1], [1, 0, 0]]
    assert p.lengths.tolist() == [3, 1]
