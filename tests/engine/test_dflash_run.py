"""``specdraft run`` with ``train.drafter: dflash``, end to end, and its overfit gate.

The 8-layer random Llama of ``engine_verifier`` answers the 6 questions of engine_kit greedily;
the run prepares, extracts (default aux ids [2, 4, 5], so ``target_layer_ids`` [1, 3, 4]),
trains a 2-layer DFlash drafter (blocks of K + 1 = 5) until it has memorised the answers,
exports it in vLLM's native DFlash format (the run's default for this drafter) and evaluates it
offline and in vLLM (``engine: vllm``, ``"method": "dflash"``) on the same questions.

The gate: the verifier's own answers, which the drafter was trained on, must be drafted right,
the whole block and not only its first token: τ >= GATE_TAU = 1 + GATE * K (and position-1
acceptance >= GATE, as the EAGLE-3 gate of test_overfit_gate.py), with vLLM's counts identical
to offline. A planted fault on the exported drafter, evaluated the same way (offline = vLLM is
shown on the good one and by test_dflash_vllm.py), must fall below it: target layer ids off by
one (the drafter reads other layers than it was trained on). Measured: good [1.0, 0.86, 0.86,
0.86] (τ 4.57) on two machines; ids + 1 gave position 1 below 0.85 on an AVX-512 CPU but 0.9
on an AMX one ([0.9, 0.78, 0.6, 0.52], τ 3.80): adjacent layers of this 8-layer verifier are
alike enough that the first token survives, the block does not, so the gate is on τ.
Those figures were measured with the `exp` slot weights; the D-PACE default (2026-12-05)
passes the same gate with vLLM's counts identical to offline (run 2026-12-05).

A causal mask inside the block is NOT caught by this gate, measured: the memorised drafter
drafts the same tokens causal or not (per position [1.0, 0.86, 0.86, 0.86] both ways). The
mask slots carry nothing but their positions, so a slot learns nothing from later slots that
it cannot compute itself once it has memorised the answer. The causal plant is caught where the
drafter is half trained, by its drafts (tests/engine/test_dflash_vllm.py: 54 of 157 blocks
differ, offline and in vLLM alike) and by the objective's own test of the mask
(tests/models/test_dflash.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from dflash_kit import edit_export  # noqa: E402
from engine_kit import MAX_TOKENS, QUESTIONS, write_prompts  # noqa: E402

pytestmark = pytest.mark.slow
BLOCK = 5  # K + 1: eval and serve k = 4 (the run's default for a DFlash drafter)
GATE = 0.85
GATE_TAU = 1 + GATE * (BLOCK - 1)  # 4.4 of at most 5


@pytest.fixture(scope="module")
def dflash_run(tmp_path_factory, engine_verifier, vllm_python) -> Path:
    from specdraft.pipeline.config import PipelineConfig
    from specdraft.pipeline.run import run

    root = tmp_path_factory.mktemp("dflash-run")
    prompts = str(write_prompts(root / "prompts.jsonl", QUESTIONS))
    cfg = {"run_dir": str(root / "run"), "verifier": str(engine_verifier),
           "generate": {"prompts": prompts, "max_tokens": MAX_TOKENS, "batch_size": 6,
                        "keep_truncated": True, "dtype": "float32"},
           "prepare": {"max_seq_len": 256}, "vocab": {"draft_vocab_size": 512}, "extract": {},
           "train": {"drafter": "dflash", "dflash_block_size": BLOCK, "dflash_layers": 2,
                     "max_steps": 100, "epochs": 1000, "lr": 3e-3,
                     "warmup_steps": 5, "val_fraction": 0.0, "eval_every": 1000,
                     "save_every": 1000, "batch_tokens": 1024, "dtype": "float32"},
           "eval": {"prompts": prompts, "max_new_tokens": MAX_TOKENS, "dtype": "float32",
                    "engine": "vllm", "engine_python": vllm_python}}
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    run(PipelineConfig.from_yaml(root / "config.yaml"))
    return root / "run"


def _offline(run_dir: Path, drafter: Path, out: Path) -> dict:
    """Offline eval of ``drafter`` on the run's questions (the run's own eval settings)."""
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import run as eval_run

    base = json.loads((run_dir / "eval" / "manifest.json").read_text())["config"]
    cfg = EvalConfig(**{**base, "drafter": str(drafter), "out": str(out), "engine": "none",
                        "run_dir": None})
    eval_run(cfg)
    return json.loads((out / "results.json").read_text())


def test_dflash_run_trains_exports_and_passes_the_gate_in_vllm(dflash_run):
    export = dflash_run / "export" / "vllm"
    cfg = json.loads((export / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert (cfg["dflash_config"]["target_layer_ids"], cfg["dflash_config"]["causal"]) == \
        ([1, 3, 4], False)  # the run's aux ids [2, 4, 5] - 1, bidirectional
    res = json.loads((dflash_run / "eval" / "results.json").read_text())
    engine = res["engine"]
    print("offline", res["tau"], res["per_position"], "vllm", engine["tau"],
          engine["per_position"])
    assert res["k"] == BLOCK - 1 and len(res["per_position"]) == BLOCK - 1
    assert engine["agreement"]["counts_identical"], engine["agreement"]
    assert engine["per_position"] == res["per_position"]
    assert res["per_position"][0] >= GATE and res["tau"] >= GATE_TAU, res["per_position"]
    summary = (dflash_run / "run" / "summary.txt").read_text(encoding="utf-8")
    spec = json.dumps({"method": "dflash", "model": str(export.resolve()),
                       "num_speculative_tokens": BLOCK - 1})
    assert spec in summary and "sglang" not in summary, summary


def test_wrong_target_layer_ids_fall_below_the_gate(dflash_run, tmp_path):
    def edit(d):
        d["target_layer_ids"] = [i + 1 for i in d["target_layer_ids"]]

    planted = edit_export(dflash_run / "export" / "vllm", tmp_path / "planted", edit)
    good = json.loads((dflash_run / "eval" / "results.json").read_text())
    bad = _offline(dflash_run, planted, tmp_path / "eval")
    print("ids + 1", bad["per_position"], "good", good["per_position"])
    assert bad["tau"] < GATE_TAU <= good["tau"]
    assert bad["tau"] < good["tau"] - 0.5
