"""A CPU-engine fix switched off shows the mismatch it mends (issue #39, item 2).

``SPECDRAFT_ENGINE_FIX_EXPAND=0`` leaves vLLM's CPU expand kernel as it is
(``eval/engine_worker.py:fix_cpu_expand``): at temperature 1 the rejection sampler then divides
the target logits by uninitialised memory and commits tokens the verifier gives probability
below e^-40 (test_vllm_sampled.py's module comment), which the offline loop never does; the
results say the fix was OFF. One engine start (an untrained drafter on the bigram verifier,
4 prompts x 48 tokens): about a minute. The fix switched on is tested by test_vllm_sampled.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from engine_kit import K, make_bigram_verifier  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SUPPORT = (1000, 1256)  # make_bigram_verifier's support
PROMPTS = [[1000 + 7 * i + j for j in range(6)] for i in range(4)]
NEW = 48


@pytest.fixture(scope="module")
def unfixed(tmp_path_factory, vllm_python, smollm2_tokenizer_dir):
    from export_kit import make_drafter, make_run

    from specdraft.core.verifier import load_verifier
    from specdraft.eval.engine import run_worker, vllm_job
    from specdraft.export.config import ExportConfig
    from specdraft.export.run import run as export

    root = tmp_path_factory.mktemp("fix_switch")
    vdir = make_bigram_verifier(root / "verifier", smollm2_tokenizer_dir)
    verifier = load_verifier(vdir, dtype="float32")
    make_run(root / "run", verifier, make_drafter(verifier, aux=(2, 4, 6)))
    export(ExportConfig(run_dir=root / "run", format="vllm", out=root / "export"))
    job = vllm_job(verifier_dir=vdir, drafter_dir=root / "export", prompts=PROMPTS, k=K,
                   temperature=1.0, max_tokens=NEW, stop_ids=[], dtype="float32")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDRAFT_ENGINE_FIX_EXPAND", "0")  # the worker inherits this environment
    try:
        res = run_worker(vllm_python, job, root / "engine", timeout_s=600)
    finally:
        mp.undo()
    return {"res": res, "verifier": verifier, "export": root / "export"}


def test_the_expand_fix_switched_off_is_recorded_and_its_bug_shows(unfixed):
    res = unfixed["res"]
    (fix,) = res["engine_fixes"]
    assert fix.startswith("OFF by SPECDRAFT_ENGINE_FIX_EXPAND=0, the bug is present and NOT "
                          "worked around") and "_expand_kernel_impl" in fix
    tokens = [t for p in res["runs"][0]["tokens"] for t in p]
    assert 0 < len(tokens) <= len(PROMPTS) * NEW  # a garbage draw may commit EOS early
    outside = [t for t in tokens if not SUPPORT[0] <= t < SUPPORT[1]]
    assert outside, "the unfixed engine committed only tokens inside the support"
    # the offline loop on the same drafter and prompts commits none (probability < e^-40)
    from specdraft.artifacts.drafter import build_model, read_drafter
    from specdraft.eval.specdec import EagleDrafter, VerifierSession, generate

    v = unfixed["verifier"]
    model = build_model(read_drafter(unfixed["export"]),
                        verifier_embed=v.get_input_embeddings().weight.detach(),
                        verifier_head=v.get_output_embeddings().weight.detach(), device="cpu",
                        dtype=torch.float32)
    for i, ids in enumerate(PROMPTS):
        g = generate(VerifierSession(v, model.config.aux_layer_ids), EagleDrafter(model), ids,
                     k=K, max_new_tokens=NEW, temperature=1.0, eos_ids=[],
                     generator=torch.Generator().manual_seed(i))
        assert all(SUPPORT[0] <= t < SUPPORT[1] for t in g.tokens)
