"""``extract --backend vllm`` on an MLA + MoE verifier (the Kimi-K2.5-shaped fixture of
``tests/kimi_fixture.py``) against ``--backend transformers`` on the same prepared rows, in the
real vLLM 0.32 CPU engine (its MLA backend, ``cpu_mla.py``); one engine start for this module.

Tolerance as ``test_vllm_equivalence.py``: both backends run float32 and store bf16, so a stored
value may differ by one bf16 rounding step: ``|vllm - hf| <= 2^-7·|hf| + 1e-5·max|hf|`` per
element, per row and per aux layer id; the final state (the verifier's final norm applied once by
specdraft to the engine's pre-norm id-N state) likewise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from specdraft.extract.config import ExtractConfig
from specdraft.extract.run import run
from specdraft.artifacts.hidden_states import DiskSource

from extract_helpers import random_rows, write_prepared
from vllm_helpers import compare_sources, engine_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kimi_fixture import HIDDEN, LAYERS, make_kimi_verifier  # noqa: E402

AUX = (1, 2, 3)  # every id the 4-layer verifier allows (core.conventions: [1, N-1])
REL, FLOOR = 2**-7, 1e-5
N_ROWS = 8


@pytest.fixture(scope="module")
def kimi_verifier(tmp_path_factory, think_tokenizer_dir) -> Path:
    return make_kimi_verifier(tmp_path_factory.mktemp("kimi") / "verifier", think_tokenizer_dir)


@pytest.fixture(scope="module")
def both(tmp_path_factory, kimi_verifier):
    """The same rows (lengths 17..66: several 16-token MLA blocks) extracted by both backends."""
    root = tmp_path_factory.mktemp("vllm_mla")
    ids, masks = random_rows([17 + 7 * i for i in range(N_ROWS)], vocab=49000, seed=7)
    kw = dict(verifier=str(kimi_verifier), aux_layers=AUX, storage="bf16", batch_tokens=200,
              dtype="float32", device="cpu")
    hf_run = write_prepared(root / "hf", ids, masks)
    run(ExtractConfig(run_dir=hf_run, **kw))
    vllm_run = write_prepared(root / "vllm", ids, masks)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in engine_env().items():
            mp.setenv(k, v)
        run(ExtractConfig(run_dir=vllm_run, backend="vllm", **kw))
    return hf_run / "extract", vllm_run / "extract", kimi_verifier


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mla_states_equal_per_row_and_layer(both):
    hf, vl, _ = both
    a, b = DiskSource(hf), DiskSource(vl)
    ratios = compare_sources(a, b, AUX, HIDDEN, rel=REL, floor=FLOOR)
    assert len(ratios) == N_ROWS * (len(AUX) + 1)
    bad = {k: v for k, v in ratios.items() if v > 1.0}
    assert not bad, bad
    m = json.loads((vl / "manifest.json").read_text())
    assert m["verifier"]["backend"] == "vllm" and m["n_layers"] == LAYERS
    assert m["verifier"]["final_state"].startswith("post_norm (applied by specdraft")


@pytest.mark.slow
def test_mla_planted_faults_fail(both):
    """A shifted layer id and a final norm applied twice are far outside the tolerance."""
    from specdraft.extract.vllm_backend import final_norm, load_engine_verifier

    hf, vl, verifier = both
    a, b = DiskSource(hf), DiskSource(vl)
    shifted = compare_sources(a, b, AUX, HIDDEN, rel=REL, floor=FLOOR, shift=1)
    assert min(v for k, v in shifted.items() if k[1] == "aux" and k[2] != AUX[-1]) > 10
    v = load_engine_verifier(verifier, torch.float32)
    twice = [final_norm(y.final_hidden, v.norm_weight, v.eps) for y in b.get_batch(range(N_ROWS))]
    worst = max(float((t - x.final_hidden).abs().max() / x.final_hidden.abs().max())
                for t, x in zip(twice, a.get_batch(range(N_ROWS))) if x.final_hidden.numel())
    assert worst > 0.05
