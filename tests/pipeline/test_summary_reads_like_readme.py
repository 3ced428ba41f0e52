"""The run summary reads like the README (issue 40): τ and τ̂ as the README spells them, the
aux ids explained per engine, no one-bucket "τ by context" table, the total time, and serve
lines at the measured dtype on the local verifier."""

from __future__ import annotations

from types import SimpleNamespace

from specdraft.core.manifest import EvalManifest, ExportManifest, TrainManifest
from specdraft.pipeline.summary import format_summary

BASE = {"config": {}, "config_hash": "x", "started_at": "a", "finished_at": "b"}


def _manifests(tmp_path, *, by_context, engine=None, eval_config=None):
    ev = EvalManifest(**{**BASE, "config": eval_config or {}}, stage="eval", elapsed_s=61.5,
                      tau=1.474, acceptance_rate=0.12, per_position=[0.32, 0.11, 0.04, 0.01], verify_steps=10,
                      tokens_per_s=3.0, by_context=by_context, engine=engine)
    tr = TrainManifest(**BASE, stage="train", elapsed_s=540.0, steps=126, best_step=120,
                       best_val={"tau": 1.552, "cond_acc": [0.4]}, drafter_config={})
    ex = ExportManifest(**BASE, stage="export", elapsed_s=3.5, format="sglang",
                        out=str(tmp_path / "export"), aux_layer_ids=[2, 15, 27],
                        engine_aux_ids={"top_level": [2, 15, 27],
                                        "eagle_config": [1, 14, 26]})
    (tmp_path / "export").mkdir(exist_ok=True)
    (tmp_path / "export" / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLMEagle3"]}')
    return {"generate": None, "train": tr, "export": ex, "eval": ev}


def _config(tmp_path, verifier="smollm2"):
    return SimpleNamespace(run_dir=tmp_path, verifier=verifier,
                           stages={"eval": SimpleNamespace(k=4, topk=1, num_draft_tokens=None)})


def test_the_readme_s_words(tmp_path):
    one = {"<512": {"tau": 1.474, "per_position": [0.32], "verify_steps": 10}}
    text = format_summary(_config(tmp_path), _manifests(tmp_path, by_context=one),
                          total_s=12.25)
    assert "offline τ 1.474, acceptance rate 0.120" in text
    assert "best validation τ̂ 1.552 (step 120)" in text
    assert "tau" not in text.replace("num_speculative_tokens", "")
    assert "by context" not in text                      # one bucket: no table
    assert ("aux layers: HF hidden_states [2, 15, 27] = vLLM ids [2, 15, 27] = SGLang ids "
            "[1, 14, 26] (config.json)") in text
    assert "{'top_level'" not in text
    # 540 + 3.5 + 61.5 = 605 s over the three stages that ran; this invocation 12.2 s
    assert "  total       605.0s  (10m05s) over the 3 stages; this invocation 12.2s" in text
    two = {**one, "512-2k": {"tau": 2.0, "per_position": [0.5], "verify_steps": 4}}
    text = format_summary(_config(tmp_path), _manifests(tmp_path, by_context=two))
    assert "; τ by context length <512 1.474, 512-2k 2.000" in text
    assert "this invocation" not in text


def test_serve_lines_at_the_measured_dtype_on_the_local_verifier(tmp_path):
    """The demo's GGUF verifier: the line names RUN/verifier-hf (with how to write it while it
    does not exist), never the hub id, and carries the dtype eval measured at."""
    ms = _manifests(tmp_path, by_context=None,
                    eval_config={"dtype": "auto", "device": "cpu"})
    text = format_summary(_config(tmp_path), ms)
    hf = str((tmp_path / "verifier-hf").resolve())
    vllm = [ln for ln in text.splitlines() if " -m vllm.entrypoints.openai.api_server " in ln]
    assert len(vllm) == 1 and f"--model {hf} --dtype float32 --speculative-config" in vllm[0]
    assert "HuggingFaceTB" not in text and "vllm serve" not in text
    assert f"# {hf} does not exist yet" in text and "gguf_to_hf_dir" in text
    engine = {"version": "0.32.0", "tau": 1.5, "per_position": [0.5], "dtype": "bfloat16"}
    text = format_summary(_config(tmp_path), _manifests(tmp_path, by_context=None,
                                                        engine=engine))
    assert "--dtype bfloat16 --speculative-config" in text   # the engine's figure's dtype
    assert "--speculative-num-draft-tokens 5 --dtype bfloat16" in text
