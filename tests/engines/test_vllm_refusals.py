"""The one table of what vLLM 0.32 cannot serve (:data:`specdraft.engines.vllm_cpu.
VLLM_REFUSALS`), applied by ``specdraft run`` when it reads its config (before any stage runs)
and by ``eval --engine vllm`` before any decode, each naming the combination and the
alternative."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdraft.core.errors import ConfigError  # noqa: E402
from specdraft.engines.vllm_cpu import Combination, vllm_refusals  # noqa: E402

BLOCK = "No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])"


@pytest.fixture
def cpu_only(monkeypatch):
    """vLLM's CPU build (this machine has no CUDA; fixed so the test reads the same on a GPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_the_table_row_by_row():
    llama_on_mla = vllm_refusals(Combination("eagle3", "llama", "deepseek_v3", 576, True))
    assert len(llama_on_mla) == 1
    assert llama_on_mla[0].startswith("vLLM cannot serve a llama-layer EAGLE-3 drafter on an "
                                      "MLA verifier (deepseek_v3) in vLLM's CPU build: ")
    assert BLOCK in llama_on_mla[0] and "instead: train --drafter-layer mla" in llama_on_mla[0]
    assert vllm_refusals(Combination("eagle3", "mla", "deepseek_v3", 576, True)) == []
    assert vllm_refusals(Combination("eagle3", "llama", "deepseek_v3", 576, False)) == []
    assert vllm_refusals(Combination("eagle3", "llama", "llama", None, True)) == []
    narrow = vllm_refusals(Combination("eagle3", "mla", "deepseek_v3", 24, True))
    assert narrow == ["vLLM cannot serve an MLA verifier (deepseek_v3) of latent width 24 "
                      "(kv_lora_rank + qk_rope_head_dim) in vLLM's CPU build: its CPU MLA "
                      "backend decodes latent width 576 only "
                      "(v1/attention/backends/mla/cpu_mla.py); instead: --engine none "
                      "(offline figures only) on this machine, or a CUDA build of vLLM"]
    gemma = vllm_refusals(Combination("eagle3", "llama", "gemma3_text", None, False))
    assert len(gemma) == 1 and "has no SupportsEagle3" in gemma[0]


def _kimi_dir(root: Path) -> Path:
    from kimi_fixture import kimi_config

    kimi_config(1024).save_pretrained(root / "kimi")  # the config is all the check reads
    return root / "kimi"


def _yaml(path: Path, verifier: Path, train: dict, engine: str = "vllm") -> Path:
    path.write_text(yaml.safe_dump({
        "run_dir": str(path.parent / "run"), "verifier": str(verifier),
        "generate": {"prompts": "builtin:demo_train"}, "train": train,
        "eval": {"prompts": "builtin:demo_eval", "engine": engine}}))
    return path


def test_run_refuses_the_combination_when_it_reads_its_config(tmp_path, cpu_only):
    """A DeepSeek-V3-shaped (Kimi) verifier, train's default layer (Llama) and eval
    --engine vllm on the CPU build: refused by PipelineConfig.from_yaml, before any stage runs,
    naming the file, the combination and --drafter-layer mla; the MLA layer passes, exported in
    vLLM's format when the file names none."""
    from specdraft.pipeline.config import PipelineConfig

    kimi = _kimi_dir(tmp_path)
    cfg = _yaml(tmp_path / "run.yaml", kimi, {})
    with pytest.raises(ConfigError) as err:
        PipelineConfig.from_yaml(cfg)
    text = str(err.value)
    assert text.startswith(f"{cfg}: eval.engine vllm with train.drafter eagle3, "
                           f"train.drafter_layer llama and verifier {kimi}: ")
    assert BLOCK in text and "train --drafter-layer mla" in text
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=r"train.drafter_layer auto \(llama\) and verifier"):
        PipelineConfig.from_yaml(_yaml(tmp_path / "auto.yaml", kimi, {"drafter_layer": "auto"}))
    ok = PipelineConfig.from_yaml(_yaml(tmp_path / "mla.yaml", kimi, {"drafter_layer": "mla"}))
    assert ok.stages["train"].drafter_layer == "mla"
    assert ok.stages["export"].format == "vllm"  # the one format that carries the MLA layer
    offline = PipelineConfig.from_yaml(_yaml(tmp_path / "none.yaml", kimi, {}, engine="none"))
    assert offline.stages["eval"].engine == "none"


def test_eval_refuses_before_any_decode(tmp_path, cpu_only):
    """eval --engine vllm with a Llama-layer drafter on the Kimi verifier: refused by
    :func:`specdraft.eval.run.refuse_unservable`, the check eval runs before decoding."""
    from kimi_fixture import kimi_config
    from transformers import AutoModelForCausalLM

    from specdraft.core.profile import resolve_profile
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import refuse_unservable
    from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel
    from specdraft.models.eagle3_mla import Eagle3MLAConfig, Eagle3MLADraftModel
    from specdraft.models.io import save_drafter

    torch.manual_seed(0)
    verifier = AutoModelForCausalLM.from_config(kimi_config(1024)).eval()
    profile = resolve_profile(verifier.config)
    llama = Eagle3Config.from_profile(profile, draft_vocab_size=64, aux_layer_ids=(1, 2, 3))
    save_drafter(Eagle3DraftModel(llama), tmp_path / "llama")
    config = EvalConfig(drafter=tmp_path / "llama", out=tmp_path / "out",
                        prompts="builtin:demo_eval", engine="vllm")
    with pytest.raises(ConfigError, match="eval --engine vllm: vLLM cannot serve a llama-layer "
                                          "EAGLE-3 drafter on an MLA verifier") as err:
        refuse_unservable(config, verifier)
    assert BLOCK in str(err.value) and "--drafter-layer mla" in str(err.value)
    mla = Eagle3MLAConfig.from_profile(profile, draft_vocab_size=64, aux_layer_ids=(1, 2, 3))
    save_drafter(Eagle3MLADraftModel(mla), tmp_path / "mla")
    refuse_unservable(config.model_copy(update={"drafter": tmp_path / "mla"}), verifier)


def test_tensor_parallel_size_reaches_the_worker_and_the_manifest(tmp_path):
    """``eval --engine-tensor-parallel-size``: passed to the vLLM worker's job (with vLLM's mp
    executor) and kept in the manifest's engine figures; size 1 leaves the job as it was."""
    from specdraft.eval.engine import vllm_job
    from specdraft.eval.run import engine_extract

    common = dict(verifier_dir=tmp_path, drafter_dir=tmp_path, prompts=[[1, 2]], k=2,
                  temperature=0.0, max_tokens=4, stop_ids=[0], dtype="bfloat16")
    job = vllm_job(**common, tensor_parallel_size=4)
    assert (job["tensor_parallel_size"], job["executor"]) == (4, "mp")
    assert vllm_job(**common) == {k: v for k, v in job.items()
                                  if k not in ("tensor_parallel_size", "executor")}
    assert engine_extract({"name": "vllm", "tensor_parallel_size": 4})["tensor_parallel_size"] \
        == 4


def test_tensor_parallel_above_1_is_refused_on_the_cpu_build(tmp_path, cpu_only):
    """On vLLM's CPU build (one worker process) a size above 1 is refused by the run's config
    check and by eval before any decode, naming the flag."""
    from transformers import AutoModelForCausalLM

    from kimi_fixture import kimi_config
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import refuse_unservable
    from specdraft.pipeline.config import PipelineConfig

    kimi = _kimi_dir(tmp_path)
    cfg = _yaml(tmp_path / "tp.yaml", kimi, {"drafter_layer": "mla"})
    data = yaml.safe_load(cfg.read_text())
    data["eval"]["engine_tensor_parallel_size"] = 2
    cfg.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"tp.yaml \[eval\]: --engine-tensor-parallel-size 2: "
                                          r"vLLM's CPU build runs here in one worker process"):
        PipelineConfig.from_yaml(cfg)
    config = EvalConfig(drafter=tmp_path, out=tmp_path / "o", prompts="builtin:demo_eval",
                        engine="vllm", engine_tensor_parallel_size=2)
    verifier = AutoModelForCausalLM.from_config(kimi_config(1024)).eval()
    with pytest.raises(ConfigError, match="needs a CUDA build of vLLM with 2 GPUs"):
        refuse_unservable(config, verifier)
