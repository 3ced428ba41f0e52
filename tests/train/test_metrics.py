"""τ̂ and conditional accuracy from a hand-made hit matrix."""

import torch

from specdraft.train.metrics import hit_counts, summarize


def test_tau_from_hand_made_hit_matrix():
    # 3 steps x 5 columns. Column 4 is unsupervised at step 2 (end of the completion).
    hits = torch.tensor([[1, 1, 1, 0, 1],
                         [1, 1, 0, 0, 1],
                         [1, 0, 0, 1, 0]], dtype=torch.bool)  # column 3 step 2: hit after a miss
    sup = torch.tensor([[1, 1, 1, 1, 1],
                        [1, 1, 1, 1, 1],
                        [1, 1, 1, 1, 0]], dtype=torch.bool)
    c = hit_counts(hits, sup)
    # sup, hit, chain, reach per step
    assert c.tolist() == [[5, 5, 4], [4, 3, 2], [4, 3, 1], [5, 4, 2]]
    m = summarize(c)
    assert m["acc"] == [4 / 5, 3 / 5, 2 / 4]
    assert m["cond_acc"] == [4 / 5, 3 / 4, 1 / 2]
    # tau = 1 + 0.8 + 0.8*0.75 + 0.8*0.75*0.5 = 1 + 0.8 + 0.6 + 0.3 = 2.7
    assert abs(m["tau"] - 2.7) < 1e-12


def test_counts_add_across_batches():
    hits = torch.tensor([[[1, 0]], [[1, 0]]], dtype=torch.bool)  # [S=2, B=1, L=2]
    sup = torch.ones(2, 1, 2, dtype=torch.bool)
    both = hit_counts(hits, sup) + hit_counts(hits, sup)
    assert summarize(both)["tau"] == 1 + 0.5 + 0.5
