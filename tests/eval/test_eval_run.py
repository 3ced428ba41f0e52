"""`specdraft eval` end to end on a tiny verifier, and the EAGLE-3 drafter inside the loop."""

import json
import sys
from pathlib import Path

import pytest
import torch
from greedy import greedy_reference

from specdraft.artifacts.prompts import sample_id

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from export_kit import make_drafter, make_run  # noqa: E402
from specdraft.eval.config import EvalConfig  # noqa: E402
from specdraft.eval.run import run  # noqa: E402
from specdraft.eval.specdec import EagleDrafter, VerifierSession, generate  # noqa: E402
from specdraft.models.io import save_drafter  # noqa: E402

PROMPT = [1, 504, 3458, 314, 253, 1345, 30]


def test_greedy_speculative_decoding_is_lossless_with_a_real_drafter(six_layer_verifier):
    m = six_layer_verifier
    d = make_drafter(m).eval()
    g = generate(VerifierSession(m, [2, 3, 4]), EagleDrafter(d), PROMPT, k=3, max_new_tokens=12)
    assert g.tokens == greedy_reference(m, PROMPT, 12)
    assert 1.0 <= g.stats.tau <= 4.0 and g.stats.committed >= 11


def test_drafter_cache_equals_full_recomputation(six_layer_verifier):
    """Feeding pairs in two chunks (cache) == one chunk; cropping drops the draft columns."""
    m = six_layer_verifier
    d = make_drafter(m).eval()
    feats = torch.randn(6, 3 * 64)
    toks = torch.tensor(PROMPT[1:])
    a, b = EagleDrafter(d), EagleDrafter(d)
    a.observe(0, feats, toks)
    b.observe(0, feats[:4], toks[:4])
    b.propose(torch.tensor(PROMPT), 3, 0.0, None)  # adds 2 temporary draft columns
    b.observe(4, feats[4:], toks[4:])               # crops them, then feeds the rest
    assert b.cache.length == a.cache.length == 6
    torch.testing.assert_close(a.last, b.last, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.propose(None, 3, 0.0, None)[0], b.propose(None, 3, 0.0, None)[0])


def test_eval_run_writes_results_and_plot(tmp_path, six_layer_verifier, six_layer_verifier_dir,
                                          shared_data):
    run_dir = make_run(tmp_path / "run", six_layer_verifier, make_drafter(six_layer_verifier))
    m = run(EvalConfig(run_dir=run_dir, verifier=str(six_layer_verifier_dir),
                       prompts=shared_data / "mt_bench" / "question.jsonl", limit=2, k=3,
                       max_new_tokens=6), verifier=six_layer_verifier)
    res = json.loads((run_dir / "eval" / "results.json").read_text())
    assert len(res["prompts"]) == 2 and res["k"] == 3
    steps = sum(p["verify_steps"] for p in res["prompts"])
    committed = sum(p["committed"] for p in res["prompts"])
    assert res["verify_steps"] == steps and res["tau"] == pytest.approx(committed / steps)
    assert len(res["per_position"]) == 3 and res["tokens_per_s"] > 0
    assert (run_dir / "eval" / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert m["tau"] == res["tau"] and (run_dir / "eval" / "manifest.json").exists()


def test_eval_drafter_dir_without_run_writes_to_out(tmp_path, six_layer_verifier,
                                                    six_layer_verifier_dir):
    save_drafter(make_drafter(six_layer_verifier), tmp_path / "d")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question": "What is 2+2?"}) + "\n" +
                       json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    run(EvalConfig(drafter=tmp_path / "d", out=tmp_path / "out", prompts=prompts,
                   verifier=str(six_layer_verifier_dir), k=2, max_new_tokens=4,
                   temperature=0.8), verifier=six_layer_verifier)
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    # rows without an id get generate's stable id: a hash of the conversation
    assert [p["id"] for p in res["prompts"]] == [sample_id(None, ["What is 2+2?"], {}, {}),
                                                 sample_id(None, ["Hi"], {}, {})]
    assert res["temperature"] == 0.8
