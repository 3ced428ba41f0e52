"""EAGLE-3.1 and the Qwen3-layer drafter served by the real vLLM (CPU build, float32).

The variants are made from the overfit drafter (``overfit_run``'s ``train/best``): the same
weights with the EAGLE-3.1 norms switched on (gains ``1 + 0.1·N(0, 1)``), or with the Qwen3
layer's q/k norms; each exported as ``vllm`` and as ``speculators`` (vLLM's speculators loader,
whose ``norm_before_residual`` default differs). All four run in ONE worker process. For each:
vLLM loads the class and tensors the drafter needs (``input_norm``, ``fc_norm``, ``q_norm``/
``k_norm`` among its parameters) and its counts (verify steps, drafted, accepted, per position)
and committed tokens equal specdraft's offline eval of the same export directory.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from engine_kit import K, MAX_TOKENS, QUESTIONS, write_prompts

pytestmark = pytest.mark.slow

VARIANTS = {
    "eagle31": {"norm_before_fc": True, "fc_norm": True, "norm_output": True},
    "qwen3": {"draft_layer": "qwen3"},
}


def variant_drafter(best, fields: dict, out, seed: int = 0):
    """``best``'s weights in a drafter with ``fields`` set; new norm gains 1 + 0.1·N(0, 1)."""
    from specdraft.models.eagle3 import Eagle3DraftModel
    from specdraft.artifacts.drafter import load_drafter
    from specdraft.models.io import save_drafter

    base = load_drafter(best)
    m = Eagle3DraftModel(dataclasses.replace(base.config, **fields))
    missing, unexpected = m.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in missing:
            p = m.get_parameter(name)
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
    return save_drafter(m, out)


@pytest.fixture(scope="session")
def variant_runs(overfit_run, engine_verifier, vllm_python, tmp_path_factory) -> dict:
    from specdraft.eval.engine import run_worker, vllm_job
    from specdraft.export.config import ExportConfig
    from specdraft.export.run import run as export

    root = tmp_path_factory.mktemp("drafter_variants")
    extracted = json.loads((overfit_run / "extract" / "manifest.json").read_text())
    paths = {}
    for name, fields in VARIANTS.items():
        drafter = variant_drafter(overfit_run / "train" / "best", fields, root / f"{name}-dir")
        for fmt in ("vllm", "speculators"):
            paths[f"{name}-{fmt}"] = root / f"{name}-{fmt}"
            export(ExportConfig(drafter=drafter, out=paths[f"{name}-{fmt}"], format=fmt,
                                verifier=str(engine_verifier),
                                verifier_name=str(engine_verifier),
                                aux_layers=tuple(extracted["aux_layer_ids"]),
                                speculative_tokens=K))
    eval_job = json.loads((overfit_run / "eval" / "engine-job.json").read_text())
    names = list(paths)
    job = vllm_job(verifier_dir=engine_verifier, drafter_dir=paths[names[0]],
                   prompts=eval_job["prompts"], k=K, temperature=0.0, max_tokens=MAX_TOKENS,
                   stop_ids=eval_job["stop_token_ids"], dtype="float32",
                   extra_runs=[{"name": n, "drafter": str(paths[n]), "k": K}
                               for n in names[1:]])
    job["runs"][0]["name"] = names[0]
    out = run_worker(vllm_python, job, root / "worker")
    runs = {r["name"]: r for r in out["runs"]}
    runs["_paths"] = paths
    return runs


@pytest.mark.parametrize("name", ["eagle31-vllm", "eagle31-speculators", "qwen3-vllm",
                                  "qwen3-speculators"])
def test_engine_counts_equal_offline(variant_runs, engine_verifier, tmp_path, name):
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import run as evaluate

    run = variant_runs[name]
    names = run["drafter_weights"]["names"]
    if name.startswith("eagle31"):
        assert any("input_norm" in n for n in names) and any("fc_norm" in n for n in names)
        assert not any("q_norm" in n for n in names)
    else:
        assert any("q_norm" in n for n in names) and any("k_norm" in n for n in names)
        assert not any("fc_norm" in n for n in names)
    prompts = write_prompts(tmp_path / "p.jsonl", QUESTIONS)
    evaluate(EvalConfig(drafter=variant_runs["_paths"][name], verifier=str(engine_verifier),
                        prompts=prompts, out=tmp_path / "eval", k=K, max_new_tokens=MAX_TOKENS,
                        dtype="float32"))
    off = json.loads((tmp_path / "eval" / "results.json").read_text())
    c = run["counters"]
    assert off["drafted"] > 0 and off["accepted"] > 0, off["per_position"]
    assert (c["drafts"], c["draft_tokens"], c["accepted"], c["per_pos"]) == (
        off["verify_steps"], off["drafted"], off["accepted"], off["per_position_accepted"])
    assert [p["tokens"] for p in off["prompts"]] == run["tokens"]
