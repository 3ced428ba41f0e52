"""Two drafters' offline evals on the same prompts, compared with a confidence interval.

τ of a set is a ratio of sums, ``Σ committed / Σ verify steps`` over its prompts
(:mod:`specdraft.eval.acceptance`), so its uncertainty comes from which prompts were drawn. The
two evals decode the same prompts, and a prompt that is easy for one drafter is easy for the
other, so the ratio τ_a / τ_b is resampled *paired*: one bootstrap draw picks prompt indices
with replacement and recomputes both τ on the same draw (the percentile bootstrap, Efron &
Tibshirani 1993, ch. 13). The interval says what another draw of prompts from the same source
could give; it says nothing about training noise (another seed), which is measured by training
again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class RatioCI:
    """τ_a / τ_b on all prompts and its ``level`` percentile interval over paired resamples."""

    ratio: float
    low: float
    high: float
    level: float
    prompts: int
    resamples: int


def prompt_counts(results: dict[str, Any]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Prompt ids, committed tokens and verify steps (int64 arrays [N]) of an offline eval's
    ``results.json`` (its ``prompts`` rows). Raises ``ValueError`` when it has no prompt rows
    (a ``--server`` eval keeps only the engine's totals)."""
    rows = results.get("prompts") or []
    if not rows:
        raise ValueError("eval results hold no per-prompt rows (an offline eval writes them)")
    return ([str(r["id"]) for r in rows], np.array([r["committed"] for r in rows], np.int64),
            np.array([r["verify_steps"] for r in rows], np.int64))


def tau_ratio_ci(a: dict[str, Any], b: dict[str, Any], *, resamples: int = 10_000,
                 level: float = 0.95, seed: int = 0) -> RatioCI:
    """τ of eval ``a`` over τ of eval ``b`` (two ``results.json`` dicts on the same prompts,
    matched by id) with a paired percentile-bootstrap interval (module docstring).

    Raises ``ValueError`` when the two evals do not hold the same prompt ids or a resample has
    no verify step (an eval of prompts that all stopped at their first token)."""
    point, low, high, n = _paired(a, b, _ratio, resamples, level, seed)
    return RatioCI(point, low, high, level, n, resamples)


@dataclass(frozen=True)
class DeltaCI:
    """τ_a − τ_b (tokens per verify step) on all prompts and its ``level`` interval."""

    delta: float
    low: float
    high: float
    level: float
    prompts: int
    resamples: int


def tau_delta_ci(a: dict[str, Any], b: dict[str, Any], *, resamples: int = 10_000,
                 level: float = 0.95, seed: int = 0) -> DeltaCI:
    """τ of eval ``a`` minus τ of eval ``b`` with the paired percentile-bootstrap interval of
    :func:`tau_ratio_ci` (the same draws for the same ``seed``); raises as it does."""
    point, low, high, n = _paired(a, b, _delta, resamples, level, seed)
    return DeltaCI(point, low, high, level, n, resamples)


def _paired(a: dict[str, Any], b: dict[str, Any], stat: Any, resamples: int, level: float,
            seed: int) -> tuple[float, float, float, int]:
    """``stat(ca, sa, cb, sb)`` on all prompts and its interval over paired resamples: (point,
    low, high, prompts)."""
    ids_a, ca, sa = prompt_counts(a)
    ids_b, cb, sb = prompt_counts(b)
    if sorted(ids_a) != sorted(ids_b) or len(set(ids_a)) != len(ids_a):
        raise ValueError(f"the evals hold different prompts ({len(ids_a)} vs {len(ids_b)} ids, "
                         f"{len(set(ids_a) ^ set(ids_b))} not in both)")
    order = [ids_b.index(i) for i in ids_a]
    cb, sb = cb[order], sb[order]
    draws = np.random.default_rng(seed).integers(0, len(ids_a), size=(resamples, len(ids_a)))
    values = stat(ca[draws].sum(1), sa[draws].sum(1), cb[draws].sum(1), sb[draws].sum(1))
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    point = stat(ca.sum(), sa.sum(), cb.sum(), sb.sum())
    return float(point), float(low), float(high), len(ids_a)


def _ratio(ca: Sequence[int] | np.ndarray, sa: Any, cb: Any, sb: Any) -> np.ndarray:
    """``(ca / sa) / (cb / sb)``, elementwise; ``ValueError`` where a step count is 0."""
    sa, sb = np.asarray(sa), np.asarray(sb)
    if (sa == 0).any() or (sb == 0).any():
        raise ValueError("a resample holds no verify step; eval more prompts")
    return (np.asarray(ca) / sa) / (np.asarray(cb) / sb)


def _delta(ca: Sequence[int] | np.ndarray, sa: Any, cb: Any, sb: Any) -> np.ndarray:
    """``ca / sa - cb / sb``, elementwise; ``ValueError`` where a step count is 0."""
    sa, sb = np.asarray(sa), np.asarray(sb)
    if (sa == 0).any() or (sb == 0).any():
        raise ValueError("a resample holds no verify step; eval more prompts")
    return np.asarray(ca) / sa - np.asarray(cb) / sb
