"""The paired bootstrap of a τ ratio and difference (specdraft.eval.compare), against values
by hand."""

from __future__ import annotations

import pytest

from specdraft.eval.compare import tau_delta_ci, tau_ratio_ci


def results(*rows: tuple[str, int, int]) -> dict:
    return {"prompts": [{"id": i, "committed": c, "verify_steps": s} for i, c, s in rows]}


def test_two_prompts_by_hand():
    # a: tau 20/15, b: tau 20/18 -> 1.2. Paired resamples of 2 prompts: {p,p} (1/4) gives
    # (10/5)/(10/8) = 1.6, {q,q} (1/4) gives 1.0, {p,q} (1/2) gives 1.2; so the 95 % interval
    # runs from 1.0 to 1.6.
    a = results(("p", 10, 5), ("q", 10, 10))
    b = results(("q", 10, 10), ("p", 10, 8))  # other order: matched by id
    ci = tau_ratio_ci(a, b, resamples=4000)
    assert ci.ratio == pytest.approx(1.2)
    assert (ci.low, ci.high) == (pytest.approx(1.0), pytest.approx(1.6))
    assert (ci.prompts, ci.resamples, ci.level) == (2, 4000, 0.95)


def test_pairing_cancels_shared_difficulty():
    # a takes half b's verify steps on every prompt: every paired resample has ratio 2 exactly,
    # whatever the spread of difficulty between prompts (resampling a and b apart would not).
    b = results(*[(f"x{i}", 40, s) for i, s in enumerate([4, 10, 20, 36, 8, 30])])
    a = results(*[(f"x{i}", 40, s // 2) for i, s in enumerate([4, 10, 20, 36, 8, 30])])
    ci = tau_ratio_ci(a, b, resamples=2000, seed=3)
    assert (ci.ratio, ci.low, ci.high) == (pytest.approx(2.0),) * 3


def test_refuses_different_prompts():
    with pytest.raises(ValueError, match="different prompts"):
        tau_ratio_ci(results(("p", 3, 1)), results(("q", 3, 1)))
    with pytest.raises(ValueError, match="no per-prompt rows"):
        tau_ratio_ci({"tau": 1.5}, results(("q", 3, 1)))


def test_difference_by_hand():
    # a: tau 20/15 = 4/3, b: tau 20/18 = 10/9 -> +2/9. Paired resamples: {p,p} (1/4) gives
    # 10/5 - 10/8 = 0.75, {q,q} (1/4) gives 0, {p,q} (1/2) gives +2/9; interval [0, 0.75].
    a = results(("p", 10, 5), ("q", 10, 10))
    b = results(("q", 10, 10), ("p", 10, 8))
    ci = tau_delta_ci(a, b, resamples=4000)
    assert ci.delta == pytest.approx(2 / 9)
    assert (ci.low, ci.high) == (pytest.approx(0.0), pytest.approx(0.75))
    with pytest.raises(ValueError, match="different prompts"):
        tau_delta_ci(results(("p", 3, 1)), results(("q", 3, 1)))
