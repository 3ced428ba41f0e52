"""A patched engine is always said: the eval line of the summary names each engine fix, and the
serve lines carry a comment when the figure they go with needed one (issue 39, Deliver 2)."""

from __future__ import annotations

from types import SimpleNamespace

from specdraft.core.manifest import EvalManifest, ExportManifest
from specdraft.pipeline.summary import format_summary

BASE = {"stage": "eval", "config": {}, "config_hash": "x", "started_at": "a",
        "finished_at": "b", "elapsed_s": 1.0}


def _summary(tmp_path, fixes):
    ev = EvalManifest(**BASE, tau=1.5, per_position=[0.5], engine={
        "version": "0.32.0", "tau": 1.5, "per_position": [0.5], "engine_fixes": fixes})
    ex = ExportManifest(**{**BASE, "stage": "export"}, format="vllm", out=str(tmp_path),
                        aux_layer_ids=[1, 2, 3])
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    config = SimpleNamespace(run_dir=tmp_path, verifier="/m/v",
                             stages={"eval": SimpleNamespace(k=2, topk=1, num_draft_tokens=None)})
    return format_summary(config, {"eval": ev, "export": ex})


def test_fixes_are_named_in_the_summary_and_beside_the_serve_line(tmp_path):
    text = _summary(tmp_path, ["expand kernel: replaced by a torch expand"])
    assert "engine patched by specdraft for this figure: expand kernel" in text
    lines = text.splitlines()
    note = next(i for i, x in enumerate(lines) if x.startswith("  # the engine figure above"))
    assert " -m vllm.entrypoints.openai.api_server --model /m/v " in lines[note + 1]


def test_no_fix_no_notice(tmp_path):
    text = _summary(tmp_path, [])
    assert "patched" not in text and "# the engine figure" not in text
