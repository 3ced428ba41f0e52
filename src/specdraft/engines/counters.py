"""vLLM's speculative-decoding counters → acceptance figures: one reading and one formula for
every way they are read (eval's in-process worker, ``llm.get_metrics()``; a running server's
Prometheus ``/metrics``). Imports the standard library only (the worker runs it in vLLM's
interpreter, :mod:`specdraft.engines.worker`).

The counters (``vllm/v1/spec_decode/metrics.py``): ``num_drafts`` (verify steps that drafted),
``num_draft_tokens``, ``num_accepted_tokens`` and ``num_accepted_tokens_per_pos[i]``. τ = 1 +
accepted / drafts (the bonus token counted), position ``i`` rate = accepted at ``i`` / drafts,
acceptance rate = accepted / draft tokens.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from specdraft.engines.process import EngineError

#: Prefix of vLLM's spec-decode counters (``_total`` follows in the Prometheus text format).
SPEC = "vllm:spec_decode_num_"
_NAMES = {"drafts": "drafts", "draft_tokens": "draft_tokens", "accepted_tokens": "accepted"}
_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)')
_LABEL = re.compile(r'(\w+)="([^"]*)"')

#: One counter sample: (metric name, position or None, value).
Sample = tuple[str, "int | None", float]


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition: ``(name, labels, value)``; comments skipped."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def prometheus_samples(text: str) -> list[Sample]:
    """The counter samples of a server's ``/metrics`` text (``position`` label → position)."""
    return [(name, int(labels["position"]) if "position" in labels else None, value)
            for name, labels, value in parse_prometheus(text)]


def metrics_samples(metrics: Iterable[Any]) -> list[Sample]:
    """The counter samples of ``LLM.get_metrics()`` (vLLM ``v1/metrics/reader.py``: a
    ``Counter`` has ``.value``, a ``Vector`` ``.values``, one per position)."""
    out: list[Sample] = []
    for m in metrics:
        if hasattr(m, "values"):
            out += [(m.name, i, v) for i, v in enumerate(m.values)]
        elif hasattr(m, "value"):
            out.append((m.name, None, int(m.value)))
    return out


def spec_counters(samples: Iterable[Sample]) -> dict[str, Any]:
    """``{"drafts", "draft_tokens", "accepted", "per_pos": [...]}``: the spec-decode samples
    summed over label sets (engines, models), ``per_pos[i]`` over position ``i``; the name
    with or without the text format's ``_total``, ``_created`` samples skipped."""
    c: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
    per_pos: dict[int, Any] = {}
    for name, pos, value in samples:
        if not name.startswith(SPEC) or name.endswith("_created"):
            continue
        key = name[len(SPEC):].removesuffix("_total")
        if key == "accepted_tokens_per_pos":
            per_pos[pos or 0] = per_pos.get(pos or 0, 0) + value
        elif key in _NAMES:
            c[_NAMES[key]] += value
    c["per_pos"] = [per_pos.get(i, 0) for i in range(max(per_pos, default=-1) + 1)]
    return c


def counter_difference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``after - before`` of two :func:`spec_counters` snapshots, position by position (a
    position missing before counts 0)."""
    pb = list(before["per_pos"]) + [0] * (len(after["per_pos"]) - len(before["per_pos"]))
    return {"drafts": after["drafts"] - before["drafts"],
            "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
            "accepted": after["accepted"] - before["accepted"],
            "per_pos": [a - b for a, b in zip(after["per_pos"], pb)]}


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
