"""Split, token-budget plans and the rank/accumulation layout of a global step."""

from specdraft.train.data import pack, plan_epoch, rank_micro_batches, split_indices


def test_pack_respects_the_budget():
    lengths = [5, 5, 3, 12, 2]
    assert pack([0, 1, 2, 3, 4], lengths, 10) == [(0, 1), (2,), (3,), (4,)]
    # (2, 3): 2 rows * 12 > 10 -> 2 alone; 3 alone (longer than the budget); 4 alone after it


def test_plan_is_deterministic_and_covers_every_row_once():
    lengths = [(i * 7) % 13 + 1 for i in range(50)]
    kw = dict(batch_tokens=40, length_window=8, seed=3)
    a = plan_epoch(list(range(50)), lengths, epoch=0, **kw)
    assert a == plan_epoch(list(range(50)), lengths, epoch=0, **kw)
    assert a != plan_epoch(list(range(50)), lengths, epoch=1, **kw)
    assert sorted(i for mb in a for i in mb) == list(range(50))
    assert all(len(mb) * max(lengths[i] for i in mb) <= 40 for mb in a)


def test_one_rank_with_accumulation_sees_the_global_batch_of_two_ranks():
    plan = [(i,) for i in range(10)]
    one = rank_micro_batches(plan, 1, 0, 1, 2)
    two = rank_micro_batches(plan, 1, 0, 2, 1) + rank_micro_batches(plan, 1, 1, 2, 1)
    assert one == two == [(2,), (3,)]


def test_split_is_stable_and_nonempty():
    keys = [f"s{i}/0" for i in range(40)]
    train, val = split_indices(keys, 0.25, 0)
    assert sorted(train + val) == list(range(40)) and 3 <= len(val) <= 18
    train2, val2 = split_indices(keys + ["new/0"], 0.25, 0)
    assert set(val) <= set(val2)
    assert len(split_indices(keys[:2], 0.01, 0)[1]) == 1
