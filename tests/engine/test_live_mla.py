"""``specdraft serve`` of the Kimi-K2.5-shaped MLA + MoE verifier (``tests/kimi_fixture.py``) in
vLLM 0.32's CPU server (its reference MLA backend, ``--attention-backend CPU_MLA`` added by serve
for float32), then ``extract --endpoint`` through it: every row and aux layer within one bf16
step of the transformers backend (tolerance as ``test_live_capture.py``).

A second server start (~2 min on 2 shared cores), in CI with the slow tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "extract"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from extract_helpers import random_rows, write_prepared  # noqa: E402
from kimi_fixture import HIDDEN, make_kimi_verifier  # noqa: E402
from vllm_helpers import compare_sources  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_kit import AUX, serve_config, served  # noqa: E402

pytestmark = pytest.mark.slow
N_ROWS = 6


@pytest.mark.timeout(900)
def test_mla_verifier_served_and_captured_equals_transformers(tmp_path, think_tokenizer_dir):
    from specdraft.artifacts.hidden_states import DiskSource
    from specdraft.extract.config import ExtractConfig
    from specdraft.extract.run import run

    verifier = make_kimi_verifier(tmp_path / "verifier", think_tokenizer_dir)
    ids, masks = random_rows([17 + 7 * i for i in range(N_ROWS)], vocab=49000, seed=7)
    kw = dict(verifier=str(verifier), aux_layers=AUX, storage="bf16", batch_tokens=200,
              dtype="float32", device="cpu")
    hf_run = write_prepared(tmp_path / "hf", ids, masks)
    run(ExtractConfig(run_dir=hf_run, **kw))
    live_run = write_prepared(tmp_path / "live", ids, masks)
    with served(serve_config(live_run, verifier)) as [(url, cmd, _)]:
        assert cmd[cmd.index("--attention-backend") + 1] == "CPU_MLA"
        m = run(ExtractConfig(run_dir=live_run, endpoint=[url], **kw))
    ratios = compare_sources(DiskSource(live_run / "extract"), DiskSource(hf_run / "extract"),
                             AUX, HIDDEN, rel=2**-7, floor=1e-5)
    assert len(ratios) == N_ROWS * (len(AUX) + 1)
    assert max(ratios.values()) <= 1.0, {k: v for k, v in ratios.items() if v > 1}
    assert m["verifier"]["endpoint"]["servers"][url]["root_check"] == "same path"
