"""The serve plan of ``specdraft eval --sweep``: τ and a predicted speedup per drafting setting.

Settings (``--sweep '2,3,5x4x8'``): ``K`` is a chain of K drafts (vLLM's
``num_speculative_tokens``, or SGLang with ``--speculative-eagle-topk 1``); ``SxKxN`` is an
SGLang tree (``--speculative-num-steps S --speculative-eagle-topk K
--speculative-num-draft-tokens N``, :mod:`specdraft.eval.tree`). Every setting decodes the same
prompts offline at temperature 0.

Cost model (:class:`CostModel`), one verify step of a setting:

    step = S · draft + verify + per_token · n

``S`` drafter forwards (one per depth; a tree's K lanes run as one batched forward, taken to
cost what one row costs, as on an accelerator that is not saturated), one verifier forward
over ``n`` tokens (a chain: k + 1; a tree: N, the root included), against plain decoding's
``verify + per_token`` per token. Predicted speedup = τ · (verify + per_token) / step, with τ
the tokens committed per verify step. Constants: given with ``--cost-model
'draft=D,verify=A,per_token=B'`` (any one unit), or timed here (:func:`measure_costs`: the
verifier's forward over 1 and over the widest n tokens after a prompt, the drafter's one-token
forward, medians of a few runs, in this process's ``transformers`` on this device) — a serving
engine's batch, kernels and graphs change them, so on CPU they rank settings for *this*
machine, not for a GPU server.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

import torch

from specdraft.core.progress import StageProgress
from specdraft.eval.shapes import CostModel, Setting, parse_sweep
from specdraft.eval.tree import sglang_accept_length


def _median_seconds(fn, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def measure_costs(verifier: Any, model: Any, prompt: Sequence[int], widest: int) -> CostModel:
    """Time the verifier over 1 and ``widest`` new tokens after ``prompt`` and the drafter's
    one-token forward (module doc); verify and per_token from the two verifier timings."""
    from specdraft.eval.specdec import EagleDrafter, VerifierSession
    from specdraft.models.eagle3 import DraftKVCache

    session = VerifierSession(verifier, model.config.aux_layer_ids)
    ids = torch.tensor(list(prompt), dtype=torch.long)
    _, aux = session.forward(ids)
    P = len(ids)

    def verify(n: int) -> None:
        session.forward(ids[-1:].repeat(n))
        session.crop(P)

    t1, tn = _median_seconds(lambda: verify(1)), _median_seconds(lambda: verify(widest))
    per_token = max(tn - t1, 0.0) / max(widest - 1, 1)
    drafter = EagleDrafter(model)
    drafter.observe(0, aux, ids)
    pos = torch.tensor([[P]], device=drafter.last.device)

    def draft() -> None:  # one draft token: the layer on a throwaway cache, then the head
        cache = DraftKVCache()
        cache.k, cache.v = drafter.cache.k, drafter.cache.v
        model.logits(model.forward_cached(ids[-1:].view(1, 1).to(pos.device), drafter.last,
                                          pos, cache))

    d = _median_seconds(draft)
    return CostModel(draft=d, verify=max(t1 - per_token, 0.0), per_token=per_token,
                     source=f"timed here: verifier over 1 and {widest} tokens after a "
                            f"{P}-token prompt, drafter 1 token")


def run_plan(config: Any, verifier: Any, model: Any, prompt_ids: list[list[int]],
             eos: Sequence[int]) -> dict[str, Any]:
    """Decode ``prompt_ids`` once per ``config.sweep`` setting (greedy) and rank the settings
    by predicted speedup (module doc). Returns ``{"cost_model", "settings": [...], "best"}``,
    each setting with its τ, per-position (per-depth) rates, SGLang accept length, verify
    tokens, predicted speedup and serve commands."""
    from specdraft.eval.acceptance import AcceptanceStats

    settings = parse_sweep(config.sweep)
    costs = CostModel.parse(config.cost_model) if config.cost_model else \
        measure_costs(verifier, model, prompt_ids[0], max(s.verify_tokens for s in settings))
    rows = []
    bar = StageProgress("eval: serve plan", total=len(settings) * len(prompt_ids),
                        unit="prompts").start()
    for s in settings:
        try:
            gens = decode_setting(verifier, model, prompt_ids, s,
                                  max_new_tokens=config.max_new_tokens, eos=eos)
        except BaseException:
            bar.close(final=False)
            raise
        bar.update(len(prompt_ids), settings=f"{len(rows) + 1}/{len(settings)}")
        stats = AcceptanceStats()
        for g in gens:
            stats.extend(g.stats)
        rows.append({"setting": s.label, "steps": s.steps, "topk": s.topk,
                     "num_draft_tokens": s.verify_tokens, "tau": stats.tau,
                     "per_position": stats.per_position(),
                     "sglang_accept_length": sglang_accept_length(gens),
                     "verify_steps": stats.verify_steps,
                     "predicted_speedup": costs.speedup(s, stats.tau)})
    bar.close(final=False)  # eval prints one line per setting next
    best = max(range(len(rows)), key=lambda i: rows[i]["predicted_speedup"])
    return {"cost_model": costs.to_dict(), "settings": rows, "best": rows[best]["setting"],
            "best_setting": {"steps": settings[best].steps, "topk": settings[best].topk,
                             "num_draft_tokens": settings[best].verify_tokens}}


def decode_setting(verifier: Any, model: Any, prompt_ids: list[list[int]], setting: Setting, *,
                   max_new_tokens: int, eos: Sequence[int]) -> list[Any]:
    """Greedy offline decoding of every prompt with ``setting``: the chain loop for a chain
    (:func:`specdraft.eval.specdec.generate`), the tree loop otherwise."""
    from specdraft.eval.specdec import EagleDrafter, VerifierSession, generate
    from specdraft.eval.tree import TreeEagleDrafter, generate_tree

    aux = model.config.aux_layer_ids
    if setting.chain:
        return [generate(VerifierSession(verifier, aux), EagleDrafter(model), ids,
                         k=setting.steps, max_new_tokens=max_new_tokens, eos_ids=eos)
                for ids in prompt_ids]
    return [generate_tree(VerifierSession(verifier, aux), TreeEagleDrafter(model), ids,
                          shape=setting.shape, max_new_tokens=max_new_tokens, eos_ids=eos)
            for ids in prompt_ids]

