"""vLLM's speculative-decoding counters → acceptance figures, one formula for every way they
are read (eval's in-process worker, ``llm.get_metrics()``; a running server's Prometheus
``/metrics``).

The counters (``vllm/v1/spec_decode/metrics.py``): ``num_drafts`` (verify steps that drafted),
``num_draft_tokens``, ``num_accepted_tokens`` and ``num_accepted_tokens_per_pos[i]``. τ = 1 +
accepted / drafts (the bonus token counted), position ``i`` rate = accepted at ``i`` / drafts,
acceptance rate = accepted / draft tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

from specdraft.engines.process import EngineError


def vllm_figures(drafts: float, draft_tokens: float, accepted: float,
                 per_pos: Sequence[float]) -> dict[str, Any]:
    """``{"tau", "acceptance_rate", "per_position", "verify_steps", "drafted", "accepted",
    "per_position_accepted"}`` from counts over one measurement (already differenced).

    Raises :class:`EngineError` when ``drafts`` is 0: the engine did not speculate (a drafter
    that did not load), and no figure would mean anything."""
    if drafts <= 0:
        raise EngineError("vllm:spec_decode_num_drafts did not move: the engine did not "
                          "speculate (is the drafter loaded? --speculative-config; the engine's "
                          "log)")
    # (drafts + accepted) / drafts, not 1 + accepted / drafts: the same integer ratio as offline
    # eval's committed / verify steps, so equal counts give bit-equal tau (the gap is 0, not 4e-16)
    return {"tau": (drafts + accepted) / drafts,
            "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
            "per_position": [a / drafts for a in per_pos],
            "verify_steps": int(drafts), "drafted": int(draft_tokens), "accepted": int(accepted),
            "per_position_accepted": [int(a) for a in per_pos]}
