"""The serve plan (specdraft.eval.plan/shapes): cost model by hand, sweep parsing and the
engines' refusals, the plan on a bigram world, the summary's serve command; τ by context
length (acceptance.by_context) and its plot series, by hand."""

import json
from types import SimpleNamespace

import pytest
import torch
from bigram import bigram_models

from specdraft.core.errors import ConfigError
from specdraft.eval.acceptance import AcceptanceStats
from specdraft.eval.config import EvalConfig
from specdraft.eval.plan import decode_setting, run_plan
from specdraft.eval.plot import context_bars
from specdraft.eval.shapes import CostModel, Setting, parse_sweep
from specdraft.pipeline.summary import _serve_lines


pytestmark = pytest.mark.usefixtures("one_thread")


def test_cost_model_by_hand():
    """draft 0.1, verify 1.0, per token 0.05; plain decoding 1.05 per token.
    chain k=3 (4 verified): step 0.3 + 1 + 0.2 = 1.5; tau 2.5 -> 2.5 * 1.05 / 1.5 = 1.75.
    tree 5x4x8: step 0.5 + 1 + 0.4 = 1.9; tau 3 -> 3 * 1.05 / 1.9 = 1.6579."""
    c = CostModel.parse("draft=0.1, verify=1.0, per_token=0.05")
    assert c.step(Setting(3)) == pytest.approx(1.5)
    assert c.speedup(Setting(3), 2.5) == pytest.approx(1.75)
    assert c.speedup(Setting(5, 4, 8), 3.0) == pytest.approx(3 * 1.05 / 1.9)
    for bad in ("draft=1,verify=1", "draft=1,verify=1,per_token=x", "draft=-1,verify=1,per_token=0",
                "draft=1,verify=1,per_token=0,extra=2"):
        with pytest.raises(ConfigError, match="--cost-model"):
            CostModel.parse(bad)


def test_sweep_parsing_and_refusals():
    assert [s.label for s in parse_sweep("2, 3,5x4x8")] == ["chain k=2", "chain k=3",
                                                            "tree 5x4x8"]
    for text, words in [("5x1x8", "speculative_num_steps"), ("2x2x9", "K \\+ \\(S-1\\)"),
                        ("3x2x3", "below --k"), ("3y2", "neither K"), ("", "neither K")]:
        with pytest.raises(ConfigError, match=words):
            parse_sweep(text)


@pytest.mark.parametrize("fields, words", [
    ({"topk": 2, "num_draft_tokens": 5, "engine": "vllm"}, "vLLM 0.32 drafts a chain"),
    ({"topk": 2, "num_draft_tokens": 5, "temperature": 0.7}, "greedy only"),
    ({"topk": 2, "num_draft_tokens": 5, "batch_size": 2}, "--batch-size 1"),
    ({"num_draft_tokens": 7}, "speculative_num_steps \\+ 1 = 5"),
    ({"sweep": "3,4x4x100"}, "--sweep 4x4x100"),
])
def test_eval_config_refuses_what_the_engine_would(tmp_path, fields, words):
    with pytest.raises(ConfigError, match=words):
        EvalConfig.build(dict(drafter=tmp_path, out=tmp_path / "o", prompts=tmp_path / "p",
                              k=4, **fields))
    assert EvalConfig(drafter=tmp_path, out=tmp_path / "o", prompts=tmp_path / "p", k=4,
                      topk=2, num_draft_tokens=6, engine="sglang").tree


def test_run_plan_on_the_same_prompts():
    verifier, drafter, prompts = bigram_models()
    cfg = SimpleNamespace(sweep="1,3,3x2x6", cost_model="draft=0.1,verify=1,per_token=0.05",
                          max_new_tokens=16)
    plan = run_plan(cfg, verifier, drafter, prompts, [])
    rows = {r["setting"]: r for r in plan["settings"]}
    assert list(rows) == ["chain k=1", "chain k=3", "tree 3x2x6"]
    for r, s in zip(plan["settings"], parse_sweep(cfg.sweep)):
        stats = AcceptanceStats()
        for g in decode_setting(verifier, drafter, prompts, s, max_new_tokens=16, eos=[]):
            stats.extend(g.stats)
        assert r["tau"] == stats.tau and r["per_position"] == stats.per_position()
        assert r["predicted_speedup"] == pytest.approx(
            stats.tau * 1.05 / (s.steps * 0.1 + 1 + 0.05 * s.verify_tokens))
    speedups = {k: r["predicted_speedup"] for k, r in rows.items()}
    assert plan["best"] == max(speedups, key=speedups.get)
    assert rows["chain k=1"]["tau"] > 1.5  # the bigram drafter's first draft is right
    json.dumps(plan)


def test_summary_prints_the_best_settings_serve_command():
    plan = {"best": "tree 5x4x8", "best_setting": {"steps": 5, "topk": 4, "num_draft_tokens": 8},
            "settings": {"tree 5x4x8": {"tau": 3.0, "predicted_speedup": 1.66}}}
    def commands(lines):  # the head, then the command lines (the "# " comments left out)
        return [x for x in lines if not x.lstrip().startswith("#")]

    lines = _serve_lines(None, SimpleNamespace(serve_plan=plan), "/x", "V", "sglang")
    assert "best setting, tree 5x4x8, predicted speedup 1.66x" in lines[0]
    assert "  # --dtype float32: the dtype the figures above were measured at" in lines
    lines = commands(lines)
    assert len(lines) == 2 and "--speculative-num-steps 5 --speculative-eagle-topk 4 " \
        "--speculative-num-draft-tokens 8 --dtype float32" in lines[1]
    chain = commands(_serve_lines(SimpleNamespace(k=2, topk=1, num_draft_tokens=None), None,
                                  "/x", "V", "sglang"))
    assert "chain k=2" in chain[0] and '"num_speculative_tokens": 2' in chain[1]
    assert "--speculative-eagle-topk 1 --speculative-num-draft-tokens 3" in chain[2]
    # a vllm-format export (EAGLE-3.1, Qwen3 layer): vLLM for the chain, nothing for a tree
    assert len(commands(_serve_lines(SimpleNamespace(k=2, topk=1, num_draft_tokens=None), None,
                                     "/x", "V", "vllm"))) == 2
    tree = _serve_lines(None, SimpleNamespace(serve_plan=plan), "/x", "V", "vllm")
    assert "no engine serves it" in tree[1]


def test_tau_by_context_length_by_hand():
    """Steps (k, accepted, committed, context): contexts 10 and 511 fall in <512 (tau
    (3 + 1) / 2 = 2), 512 and 2047 in 512-2k (tau (4 + 2) / 2 = 3), 2048 in >=2k (tau 1)."""
    s = AcceptanceStats()
    for k, acc, com, ctx in [(3, 2, 3, 10), (3, 0, 1, 511), (3, 3, 4, 512), (3, 1, 2, 2047),
                             (3, 0, 1, 2048)]:
        s.add(k, acc, com, context=ctx)
    by = s.by_context()
    assert list(by) == ["<512", "512-2k", ">=2k"]
    assert by["<512"] == {"tau": 2.0, "per_position": [0.5, 0.5, 0.0], "verify_steps": 2}
    assert by["512-2k"] == {"tau": 3.0, "per_position": [1.0, 0.5, 0.5], "verify_steps": 2}
    assert by[">=2k"]["tau"] == 1.0 and s.summary()["by_context"] == by
    assert context_bars(by) == [("<512", 2.0, 2), ("512-2k", 3.0, 2), (">=2k", 1.0, 1)]
    short = AcceptanceStats()
    short.add(2, 1, 2, context=40)
    assert list(short.by_context()) == ["<512"]  # empty buckets left out


def test_eval_run_with_a_tree_and_a_sweep(tmp_path, six_layer_verifier, six_layer_verifier_dir,
                                          shared_data):
    """``specdraft eval --topk 2 --num-draft-tokens 6 --sweep 2,3x2x6``: the tree's figures,
    τ by context, the plan and its manifest line; the tree's tokens are the chain's (both
    greedy)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
    from export_kit import make_drafter, make_run

    from specdraft.core.manifest import EvalManifest
    from specdraft.eval.run import run

    run_dir = make_run(tmp_path / "run", six_layer_verifier, make_drafter(six_layer_verifier))
    common = dict(run_dir=run_dir, verifier=str(six_layer_verifier_dir), limit=2, k=3,
                  prompts=shared_data / "mt_bench" / "question.jsonl", max_new_tokens=8,
                  overwrite=True)
    run(EvalConfig(**common), verifier=six_layer_verifier)
    chain = json.loads((run_dir / "eval" / "results.json").read_text())
    m = run(EvalConfig(**common, topk=2, num_draft_tokens=6, sweep="2,3x2x6",
                       cost_model="draft=0.1,verify=1,per_token=0.05"),
            verifier=six_layer_verifier)
    res = json.loads((run_dir / "eval" / "results.json").read_text())
    assert [p["tokens"] for p in res["prompts"]] == [p["tokens"] for p in chain["prompts"]]
    assert res["tree"]["topk"] == 2 and res["tree"]["num_draft_tokens"] == 6
    assert res["sglang_accept_length"] == pytest.approx(16 / res["verify_steps"])
    assert list(res["by_context"]) == ["<512"]
    assert res["by_context"]["<512"]["verify_steps"] == res["verify_steps"]
    assert [r["setting"] for r in res["serve_plan"]["settings"]] == ["chain k=2", "tree 3x2x6"]
    assert res["serve_plan"]["settings"][1]["tau"] == pytest.approx(res["tau"])
    line = EvalManifest(**m).figures()
    assert "SGLang tree 3x2x6, accept length" in line and f"serve plan: best " \
        f"{res['serve_plan']['best']}" in line
    assert "by context" not in line  # one bucket: the offline τ itself, not a table
    assert (run_dir / "eval" / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
