"""Acceptance-aware metrics of a TTT unroll: per-step accuracy, conditional accuracy and ``τ̂``.

A hit at step k, column t, is the drafter's greedy draft token equal to the verifier's greedy
token (the label) at a supervised position. Counts per step k (sums, so they add across
micro-batches and ranks with one all-reduce):

- ``sup[k]``: columns supervised at step k; ``hit[k]``: hits among them;
- ``chain[k]``: columns supervised at steps 0..k with hits at all of steps 0..k;
- ``reach[k]``: columns supervised at steps 0..k with hits at steps 0..k-1 (all of them at k=0).

``acc_k = hit[k]/sup[k]``; ``cond_acc_k = chain[k]/reach[k]`` (the chance that draft token k is
accepted given the earlier ones were); ``τ̂ = 1 + Σ_k Π_{i<=k} cond_acc_i``: the expected
number of tokens per verifier step in chain drafting at temperature 0, bonus token included
(the quantity vLLM reports as mean acceptance length = 1 + accepted / drafts).
"""

from __future__ import annotations

import torch

COUNT_NAMES = ("sup", "hit", "chain", "reach")


def hit_counts(hits: torch.Tensor, sup: torch.Tensor) -> torch.Tensor:
    """hits, sup [S, ...] bool (hits imply sup) -> counts [4, S] float64 in :data:`COUNT_NAMES`
    order."""
    S = hits.shape[0]
    hits = hits.reshape(S, -1)
    sup = sup.reshape(S, -1)
    all_sup = sup.long().cumprod(0).bool()  # [S, N] supervised at 0..k
    chain = (hits & all_sup).long().cumprod(0).bool()  # [S, N] hit at 0..k
    before = torch.cat([torch.ones_like(chain[:1]), chain[:-1]], dim=0)  # hit at 0..k-1
    reach = all_sup & before
    return torch.stack([sup.sum(1), hits.sum(1), chain.sum(1), reach.sum(1)]).double()


def summarize(counts: torch.Tensor) -> dict[str, object]:
    """counts [4, S] -> ``{"acc": [S], "cond_acc": [S], "tau": float}`` (plain Python numbers;
    a ratio with a zero denominator is 0.0)."""
    sup, hit, chain, reach = (counts[i].tolist() for i in range(4))
    acc = [h / s if s else 0.0 for h, s in zip(hit, sup)]
    cond = [c / r if r else 0.0 for c, r in zip(chain, reach)]
    tau, prod = 1.0, 1.0
    for c in cond:
        prod *= c
        tau += prod
    return {"acc": acc, "cond_acc": cond, "tau": tau}
