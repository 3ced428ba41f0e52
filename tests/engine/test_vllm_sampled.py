"""Temperature > 0 against the real vLLM 0.32 CPU engine: the offline eval with vLLM's rule
(greedy drafting, its default) agrees with vLLM per position; the probabilistic rule (what
specdraft applied before, a planted wrong rule here) is caught by the same comparison.

The two sides draw different random numbers, so tokens and counts differ; only the rates can
agree. :func:`specdraft.eval.engine.sampled_agreement` compares them within a 99% two-binomial
interval from the number of verify steps on each side.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from engine_kit import K, QUESTIONS, write_prompts  # noqa: E402

#: UNFINISHED (skipped): run once here, at temperature 1 this drafter accepted 0 of 378 drafts
#: per side (offline and vLLM agree, but the planted rule cannot be told apart at 0), and the
#: module fixture ran past pytest-timeout's 900 s on 2 busy cores. Lower temperatures do not
#: help with this fixture (offline, 12 prompts x 64 tokens, 2026-12-03): position-1 acceptance
#: greedy / probabilistic 0.007 / 0.009 at T 0.3, 0.003 / 0.004 at T 0.6, 0.000 / 0.012 at T 1,
#: against a 99 % interval width of ~0.01: the drafter memorised the chaotic verifier's greedy
#: answers, and a sampled path leaves them at once. To finish: a verifier with peaked
#: next-token distributions (a scaled lm_head) and a drafter trained on sampled answers, so that
#: q is neither one-hot nor p, and a timeout mark.
pytestmark = [pytest.mark.slow,
              pytest.mark.skip(reason="unfinished: no power at temperature 1 (0/378 accepted "
                                      "both sides); see the module comment")]

#: New tokens per prompt: 6 prompts x 64 tokens give ~380 verify steps per side at the
#: temperature-1 acceptance of this drafter (~0.02 at position 1 in vLLM).
NEW_TOKENS, TEMPERATURE = 64, 1.0


def _eval(overfit_run, engine_verifier, prompts, out, **kw) -> dict:
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import run as evaluate

    evaluate(EvalConfig(drafter=overfit_run / "export" / "sglang", verifier=str(engine_verifier),
                        prompts=prompts, out=out, k=K, max_new_tokens=NEW_TOKENS,
                        temperature=TEMPERATURE, dtype="float32", **kw))
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def sampled(overfit_run, engine_verifier, vllm_python, tmp_path_factory) -> dict:
    """``eval --engine vllm`` at temperature 1 (greedy drafting, the default: one engine start),
    and the offline eval alone with probabilistic drafting on the same prompts."""
    root = tmp_path_factory.mktemp("sampled")
    prompts = write_prompts(root / "p.jsonl", QUESTIONS)
    greedy = _eval(overfit_run, engine_verifier, prompts, root / "greedy", engine="vllm",
                   engine_python=vllm_python)
    planted = _eval(overfit_run, engine_verifier, prompts, root / "probabilistic",
                    draft_sample_method="probabilistic")
    return {"greedy": greedy, "probabilistic": planted, "root": root}


def test_engine_run_is_labelled_with_the_rule_it_ran(sampled):
    """The engine's method is read back from vLLM's config (``draft_sample_method`` greedy,
    its default) and named in results and manifest, beside the offline rule."""
    off, eng = sampled["greedy"], sampled["greedy"]["engine"]
    assert eng["draft_sample_method"] == "greedy"
    assert "accept with p(draft)" in eng["acceptance_rule"]
    assert off["acceptance_rule"] == eng["acceptance_rule"]
    assert "min(1, p/q)" in sampled["probabilistic"]["acceptance_rule"]
    manifest = json.loads((sampled["root"] / "greedy" / "manifest.json").read_text())
    assert manifest["acceptance_rule"] == off["acceptance_rule"]
    assert manifest["engine"]["draft_sample_method"] == "greedy"


def test_offline_with_vllms_rule_agrees_per_position(sampled):
    """Per position, offline rate - vLLM rate lies within the 99% interval
    ``2.576 * sqrt(r (1 - r) (1/n_off + 1/n_vllm))`` (r pooled), n = verify steps per side
    (each >= 300 here: 6 prompts x 64 tokens at τ near 1). Both sides sample from seeded
    generators (vLLM's drafter draws no random numbers with greedy drafting), so the result is
    reproducible on one build."""
    agree = sampled["greedy"]["engine"]["sampled_agreement"]
    assert min(agree["steps"].values()) >= 300, agree["steps"]
    assert agree["all_within"], agree["positions"]


def test_planted_probabilistic_rule_is_caught(sampled):
    """The offline eval with probabilistic drafting (min(1, p/q); the rule specdraft applied
    before) against the same vLLM run: position 1 falls outside the 99% interval."""
    from specdraft.eval.engine import sampled_agreement, figures

    eng = sampled["greedy"]["engine"]
    agree = sampled_agreement(sampled["probabilistic"], eng)
    assert not agree["positions"][0]["within"], agree["positions"]
    assert figures({"drafts": eng["verify_steps"], "draft_tokens": eng["drafted"],
                    "accepted": eng["accepted"], "per_pos": eng["per_position_accepted"]}
                   )["per_position"] == eng["per_position"]
