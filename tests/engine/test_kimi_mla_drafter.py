"""The MLA drafter trained by specdraft (``train --drafter-layer mla``) on the Kimi-K2.5-shaped
verifier (``tests/kimi_fixture.py`` with the think tokenizer, saved to disk; eval's worker loads a
tokenizer), exported by ``specdraft export --format vllm`` and served by the real engine through
eval's own worker (``specdraft.eval.engine``): one worker process, three ``vllm.LLM`` starts (the
export, no drafter, a planted layout fault). The engine must load it as
``Eagle3DeepseekV2ForCausalLM``, its greedy output must equal decoding without it, it must accept
what it memorised (the drafter overfits the verifier's own greedy answers to the same prompts),
and the offline loop on the same prompt ids must count exactly what vLLM counted (float32)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from kimi_fixture import kimi_config  # noqa: E402
from memsource import MemorySource, greedy_corpus, write_vocab  # noqa: E402

pytestmark = pytest.mark.slow
PROMPT, K, NEW = 6, 3, 30


@pytest.fixture(scope="module")
def served(tmp_path_factory, vllm_python, think_tokenizer_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdraft.eval.engine import run_worker, vllm_job
    from specdraft.export.config import ExportConfig
    from specdraft.export.run import run as export
    from specdraft.models.io import load_drafter
    from specdraft.train.config import TrainConfig
    from specdraft.train.run import run

    root = tmp_path_factory.mktemp("kimi_mla")
    tok = AutoTokenizer.from_pretrained(think_tokenizer_dir)
    torch.manual_seed(0)
    verifier = AutoModelForCausalLM.from_config(kimi_config(len(tok))).eval()
    with torch.no_grad():
        verifier.lm_head.weight.mul_(30.0)  # a peaked teacher
    verifier.save_pretrained(root / "verifier")
    tok.save_pretrained(root / "verifier")
    corpus = greedy_corpus(verifier, 8, prompt_len=PROMPT, gen_len=NEW, vocab_range=2000)
    write_vocab(root / "run", corpus, len(tok))
    run(TrainConfig(run_dir=root / "run", drafter_layer="mla", epochs=500, max_steps=80, ttt_steps=K,
                    lr=1e-2, warmup_steps=2, batch_tokens=36 * 8, val_fraction=0.0,
                    eval_every=1000, save_every=1000, log_every=10, dtype="float32",
                    teacher_check=False), verifier=verifier, source=MemorySource(verifier, corpus))
    drafter = load_drafter(root / "run" / "train" / "last")
    export(ExportConfig(drafter=root / "run" / "train" / "last", out=root / "export",
                        format="vllm", verifier=str(root / "verifier"),
                        aux_layers=tuple(drafter.config.aux_layer_ids)))
    config = json.loads((root / "export" / "config.json").read_text())
    tensors = load_file(str(root / "export" / "model.safetensors"))
    # planted: kv_a_proj_with_mqa's rows in the other order (rope key first, then the latent),
    # the split a wrong reading of the layout would write
    w = tensors["midlayer.self_attn.kv_a_proj_with_mqa.weight"]
    lat = config["kv_lora_rank"]
    bad = {**tensors, "midlayer.self_attn.kv_a_proj_with_mqa.weight":
           torch.cat([w[lat:], w[:lat]]).contiguous()}
    (root / "planted").mkdir()
    (root / "planted" / "config.json").write_text(json.dumps(config, indent=2))
    save_file(bad, str(root / "planted" / "model.safetensors"), metadata={"format": "pt"})
    job = vllm_job(verifier_dir=root / "verifier", drafter_dir=root / "export",
                   prompts=[ids[:PROMPT] for _, ids, _ in corpus], k=K, temperature=0.0,
                   max_tokens=NEW, stop_ids=[], dtype="float32",
                   extra_runs=[{"name": "plain", "drafter": None, "k": 0},
                               {"name": "planted", "drafter": str(root / "planted"), "k": K}])
    return run_worker(vllm_python, job, root / "engine", timeout_s=900), root, verifier, corpus


def test_vllm_serves_the_mla_drafter(served):
    from specdraft.eval.engine import figures

    res, root, _, _ = served
    log = (root / "engine" / "engine.log").read_text()
    assert "Resolved architecture: Eagle3DeepseekV2ForCausalLM" in log
    spec, plain = res["runs"][0], res["runs"][1]
    assert spec["tokens"] == plain["tokens"]  # the drafter never changes greedy output
    fig = figures(spec["counters"])
    print(json.dumps({k: fig[k] for k in ("tau", "acceptance_rate", "per_position")}))
    assert fig["per_position"][0] >= 0.8 and fig["tau"] >= 2.5, fig
    planted = figures(res["runs"][2]["counters"])
    print(json.dumps({k: planted[k] for k in ("tau", "acceptance_rate", "per_position")}))
    assert res["runs"][2]["tokens"] == plain["tokens"]
    assert planted["tau"] < fig["tau"] - 0.5, (planted, fig)


def test_offline_counts_equal_the_engine_on_the_export(served):
    """The exported directory read back (:func:`specdraft.artifacts.drafter.read_drafter`, the
    reader eval uses) and decoded by the offline loop on the prompt ids the engine got: the same
    verify steps, drafts, acceptances per position and committed tokens."""
    from types import SimpleNamespace

    from specdraft.artifacts.drafter import build_model, read_drafter
    from specdraft.eval.acceptance import AcceptanceStats
    from specdraft.eval.run import decode

    res, root, verifier, corpus = served
    model = build_model(read_drafter(root / "export"))
    cfg = SimpleNamespace(k=K, max_new_tokens=NEW, temperature=0.0, seed=0, batch_size=1,
                          tree=False, draft_sample_method="greedy")
    gens = decode(cfg, verifier, model, [ids[:PROMPT] for _, ids, _ in corpus], [])
    stats = AcceptanceStats()
    for g in gens:
        stats.extend(g.stats)
    off = stats.summary()
    c = res["runs"][0]["counters"]
    assert (c["drafts"], c["draft_tokens"], c["accepted"], c["per_pos"]) == (
        off["verify_steps"], off["drafted"], off["accepted"], off["per_position_accepted"])
    assert [list(g.tokens) for g in gens] == res["runs"][0]["tokens"]
