"""`specdraft run`: skipping complete stages, rerunning what changed, resuming an interrupted
extraction (kill -9) to the same artifacts as an uninterrupted run, and the summary."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from killing import kill9_when
import yaml

from specdraft.pipeline.config import PipelineConfig
from specdraft.pipeline.run import run

RAN = {"ran"}


def write_config(path: Path, run_dir: Path, verifier: Path, **overrides) -> Path:
    cfg = {
        "run_dir": str(run_dir), "verifier": str(verifier),
        "generate": {"prompts": "builtin:demo_train", "limit": 6, "max_tokens": 10,
                     "batch_size": 6, "keep_truncated": True},
        "prepare": {"max_seq_len": 128},
        "vocab": {"draft_vocab_size": 256},
        "extract": {},
        "train": {"max_steps": 3, "ttt_steps": 2, "warmup_steps": 1, "val_fraction": 0.34,
                  "eval_every": 2, "save_every": 2, "batch_tokens": 512},
        "export": {"format": "sglang"},
        "eval": {"prompts": "builtin:demo_eval", "limit": 1, "max_new_tokens": 6, "k": 2},
    }
    for section, values in overrides.items():
        cfg[section] = {**cfg.get(section, {}), **values} if isinstance(values, dict) else values
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_skip_then_rerun_only_changed_stages(tmp_path, verifier8):
    run_dir = tmp_path / "run"
    cfg = write_config(tmp_path / "a.yaml", run_dir, verifier8)
    first = run(PipelineConfig.from_yaml(cfg))
    assert set(first["actions"].values()) == RAN and len(first["actions"]) == 7
    for stage in first["actions"]:
        assert (run_dir / stage / "manifest.json").exists(), stage
    assert (run_dir / "export" / "sglang" / "model.safetensors").exists()
    eval_before = json.loads((run_dir / "eval" / "manifest.json").read_text())
    assert eval_before["tau"] >= 1.0

    second = run(PipelineConfig.from_yaml(cfg))
    assert set(second["actions"].values()) == {"skipped (complete)"}
    assert json.loads((run_dir / "eval" / "manifest.json").read_text()) == eval_before

    cfg_b = write_config(tmp_path / "b.yaml", run_dir, verifier8, train={"lr": 3e-4})
    third = run(PipelineConfig.from_yaml(cfg_b))
    assert third["actions"] == {
        "generate": "skipped (complete)", "prepare": "skipped (complete)",
        "vocab": "skipped (complete)", "extract": "skipped (complete)",
        "train": "ran", "export": "ran", "eval": "ran"}
    summary = (run_dir / "run" / "summary.txt").read_text(encoding="utf-8")
    assert "offline τ " in summary and "--speculative-algorithm EAGLE3" in summary
    export_dir = (run_dir / "export" / "sglang").resolve()
    assert (f'"model": "{export_dir}", "num_speculative_tokens": 2' in summary
            and f"--model-path {verifier8} " in summary)
    # the export's model card: written by export, rewritten by eval with its figures
    from huggingface_hub import ModelCard

    card = ModelCard.load(export_dir / "README.md")
    assert card.data.library_name == "vllm" and "eagle3" in card.data.tags
    ev = json.loads((run_dir / "eval" / "manifest.json").read_text())
    rates = ", ".join(f"{r:.3f}" for r in ev["per_position"])
    assert f"**τ {ev['tau']:.3f}**" in card.text and f"[{rates}]" in card.text
    steps = json.loads((run_dir / "train" / "manifest.json").read_text())["steps"]
    assert f"| optimizer steps | {steps} |" in card.text
    assert f"api_server --model {verifier8} --dtype float32" in card.text


def _digest(extract_dir: Path) -> dict[str, str]:
    files = [extract_dir / "index.jsonl", *sorted((extract_dir / "shards").iterdir())]
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def _conversations(path: Path, n: int) -> Path:
    """n two-message conversations of varied length (the `--data` input of prepare)."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    with open(path, "w") as f:
        for i in range(n):
            answer = " ".join(words[(i + j) % len(words)] for j in range(20 + (7 * i) % 60))
            f.write(json.dumps({"id": f"c{i}", "messages": [
                {"role": "user", "content": f"Say words, round {i}."},
                {"role": "assistant", "content": answer}]}) + "\n")
    return path


@pytest.mark.timeout(600)
def test_interrupted_extraction_resumes_to_identical_artifacts(tmp_path, verifier8):
    data = _conversations(tmp_path / "conv.jsonl", 300)
    extra = {"prepare": {"data": str(data), "max_seq_len": 256},
             "extract": {"shard_mb": 0.05, "batch_tokens": 256}}
    killed = tmp_path / "killed"
    cfg = write_config(tmp_path / "k.yaml", killed, verifier8, **extra)
    cli = [sys.executable, "-m", "specdraft.cli", "run", str(cfg), "--from", "prepare",
           "--until", "extract"]
    shards = killed / "extract" / "shards"
    kill9_when(cli, lambda: shards.exists() and len(list(shards.glob("*.safetensors"))) >= 2)
    assert not (killed / "extract" / "manifest.json").exists()

    resumed = run(PipelineConfig.from_yaml(cfg), from_stage="prepare", until="extract")
    assert resumed["actions"] == {"prepare": "skipped (complete)",
                                  "vocab": "skipped (complete)", "extract": "resumed"}
    clean_cfg = write_config(tmp_path / "c.yaml", tmp_path / "clean", verifier8, **extra)
    run(PipelineConfig.from_yaml(clean_cfg), from_stage="prepare", until="extract")
    assert _digest(killed / "extract") == _digest(tmp_path / "clean" / "extract")


def test_config_errors_name_section_and_flag(tmp_path, verifier8):
    from specdraft.core.errors import ConfigError

    cfg = write_config(tmp_path / "bad.yaml", tmp_path / "r", verifier8,
                       train={"ttt_steps": 0})
    with pytest.raises(ConfigError, match=r"(?s)\[train\].*--ttt-steps"):
        PipelineConfig.from_yaml(cfg)
    cfg = write_config(tmp_path / "bad2.yaml", tmp_path / "r", verifier8,
                       trian={"lr": 1})
    with pytest.raises(ConfigError, match="unknown key.*trian"):
        PipelineConfig.from_yaml(cfg)
    # the EAGLE-3.1 norms in a format SGLang loads: refused before any stage, not after train
    norms = {"norm_before_fc": True, "fc_norm": True, "norm_output": True}
    cfg = write_config(tmp_path / "e31.yaml", tmp_path / "r", verifier8, train=norms)
    with pytest.raises(ConfigError, match=r"\[export\]: format sglang: the drafter was trained "
                       r"with norm_before_fc=True, but sglang does not read norm_before_fc.*"
                       r"export.format: vllm"):
        PipelineConfig.from_yaml(cfg)
    cfg = write_config(tmp_path / "e31v.yaml", tmp_path / "r", verifier8, train=norms,
                       export={"format": "vllm"})
    assert PipelineConfig.from_yaml(cfg).stages["export"].format == "vllm"
    # no format named: vLLM's, which carries the norms (and eval reads that export)
    cfg = write_config(tmp_path / "e31d.yaml", tmp_path / "r", verifier8, train=norms,
                       export=None)
    stages = PipelineConfig.from_yaml(cfg).stages
    assert stages["export"].format == "vllm"
    assert str(stages["eval"].drafter).endswith("export/vllm")
    cfg = write_config(tmp_path / "e3d.yaml", tmp_path / "r", verifier8, export=None)
    assert PipelineConfig.from_yaml(cfg).stages["export"].format == "sglang"


def test_dump_config_is_a_valid_pipeline_config(tmp_path):
    from specdraft.pipeline.dump import dump_default_config

    text = dump_default_config()
    data = yaml.safe_load(text)
    data["generate"]["prompts"] = "builtin:demo_train"
    data["eval"]["prompts"] = "builtin:demo_eval"
    path = tmp_path / "dumped.yaml"
    path.write_text(yaml.safe_dump(data))
    config = PipelineConfig.from_yaml(path)
    assert config.stages["train"].ttt_steps == 7 and config.stages["vocab"].draft_vocab_size == 32000
    assert str(config.stages["eval"].drafter).endswith("export/sglang")


def test_until_needs_no_section_of_a_stage_that_will_not_run(tmp_path):
    """``--until export`` with no ``eval`` section (whose ``prompts`` is required) validates;
    running every stage still requires it, and a section present is validated even when its stage
    will not run."""
    from specdraft.core.errors import ConfigError
    from specdraft.pipeline.run import select_stages

    path = tmp_path / "no-eval.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "r"),
                                    "generate": {"prompts": "builtin:demo_train"}}))
    selected = [s.name for s in select_stages(None, "export")]
    config = PipelineConfig.from_yaml(path, selected=selected)
    assert list(config.stages) == ["generate", "prepare", "vocab", "extract", "train", "export"]
    with pytest.raises(ConfigError, match=r"\[eval\].*--prompts"):
        PipelineConfig.from_yaml(path)
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "r"), "eval": {"k": 0},
                                    "generate": {"prompts": "builtin:demo_train"}}))
    with pytest.raises(ConfigError, match=r"\[eval\].*--k"):
        PipelineConfig.from_yaml(path, selected=selected)


def test_one_chat_format_per_run(tmp_path, verifier8):
    """A chat setting given in one stage section (here generate's, as a user writes it) reaches
    every stage that renders chats, so local generation and prepare agree: before, this run
    stopped at prepare ("prepare would render chats unlike the local generation"). ``chat:``
    sets it once; two different values are refused naming both places."""
    from specdraft.core.errors import ConfigError

    kwargs = {"enable_thinking": False}
    cfg = write_config(tmp_path / "a.yaml", tmp_path / "a", verifier8,
                       generate={"chat_template_kwargs": kwargs})
    config = PipelineConfig.from_yaml(cfg)
    assert [config.stages[s].chat_template_kwargs for s in ("generate", "prepare", "eval")] \
        == [kwargs] * 3
    manifest = run(config, until="prepare")
    assert manifest["actions"] == {"generate": "ran", "prepare": "ran"}
    chat = json.loads((tmp_path / "a" / "prepare" / "chat_format.json").read_text())
    assert chat["kwargs"] == kwargs

    cfg = write_config(tmp_path / "b.yaml", tmp_path / "b", verifier8,
                       chat={"think_tokens": ["<t>", "</t>"], "stop_tokens": ["<|im_end|>"]})
    config = PipelineConfig.from_yaml(cfg)
    gen, prep = config.stages["generate"], config.stages["prepare"]
    assert (gen.think_tokens, gen.stop_tokens) == (("<t>", "</t>"), ("<|im_end|>",))
    assert (prep.think_tokens, prep.stop_tokens) == (("<t>", "</t>"), ("<|im_end|>",))

    from transformers import AutoTokenizer

    template = tmp_path / "template.jinja"
    template.write_text("{#- ours -#}" + AutoTokenizer.from_pretrained(verifier8).chat_template)
    cfg = write_config(tmp_path / "t.yaml", tmp_path / "t", verifier8, chat={
        "template": str(template), "stop_tokens": ["<|im_end|>"]})
    run(PipelineConfig.from_yaml(cfg), until="prepare")       # local generation renders with it
    for stage in ("generate", "prepare"):
        chat = json.loads((tmp_path / "t" / stage / "chat_format.json").read_text())
        assert (chat["template_source"], chat["stop_tokens"]) == (str(template), ["<|im_end|>"])

    cfg = write_config(tmp_path / "c.yaml", tmp_path / "c", verifier8, chat={
        "template_kwargs": kwargs}, prepare={"chat_template_kwargs": {"enable_thinking": True}})
    with pytest.raises(ConfigError, match=r"`template_kwargs` differs \(chat: .*prepare\."
                                          r"chat_template_kwargs: .*set it once under `chat:`"):
        PipelineConfig.from_yaml(cfg)
    cfg = write_config(tmp_path / "d.yaml", tmp_path / "d", verifier8, chat={"templat": "x"})
    with pytest.raises(ConfigError, match=r"\[chat\]: unknown key\(s\) \['templat'\]"):
        PipelineConfig.from_yaml(cfg)


def test_legacy_think_pair_folds_by_generate_s_one_rule(tmp_path, verifier8):
    """``think_open``/``think_close`` of an older ``[generate]`` section become every stage's
    ``think_tokens`` by :func:`specdraft.generate.config.fold_think_pair` (the rule generate's
    config uses); one alone, or the pair beside ``think_tokens``, is refused naming the rule."""
    from specdraft.core.errors import ConfigError
    from specdraft.generate.config import fold_think_pair

    cfg = write_config(tmp_path / "a.yaml", tmp_path / "a", verifier8,
                       generate={"think_open": "<t>", "think_close": "</t>"})
    config = PipelineConfig.from_yaml(cfg)
    assert config.stages["generate"].think_tokens == ("<t>", "</t>")
    assert config.stages["prepare"].think_tokens == ("<t>", "</t>")
    for bad in ({"think_open": "<t>"}, {"think_open": "<t>", "think_close": "</t>",
                                        "think_tokens": ["<a>", "</a>"]}):
        cfg = write_config(tmp_path / "b.yaml", tmp_path / "b", verifier8, generate=bad)
        with pytest.raises(ConfigError, match=r"\[generate\]: think_open/think_close: give "
                                              r"both, or think_tokens"):
            PipelineConfig.from_yaml(cfg)
    assert fold_think_pair({"x": 1}) == {"x": 1}
    assert fold_think_pair({"think_open": "a", "think_close": "b"}) == {"think_tokens": ["a", "b"]}
