"""The whole pipeline on a tiny random verifier of each family (built in-process from a config,
tests/family_configs.py): ``specdraft run --from prepare`` through prepare → vocab → extract →
train (2 steps) → export → offline eval, with real values asserted per family: the extracted
states are the model's own (aux = ``hidden_states[i]``, final = ``last_hidden_state``, whose
head product is the model's logits), the teacher check passed with a zero gap, the export
loads back with the trained tensors, eval's counts add up and its greedy output equals plain
greedy decoding; the doctor's teacher check passes on the run directory."""

from __future__ import annotations

import functools
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))
from family_configs import FAMILIES, tiny_model  # noqa: E402
from greedy import greedy_reference  # noqa: E402
from qwen3_template import QWEN3_TEMPLATE  # noqa: E402

pytestmark = pytest.mark.slow

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi".split()
QWEN3_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                "</tool_response>"]


@functools.lru_cache(maxsize=None)
def tokenizer_of(verifier: Path):
    """The verifier's tokenizer, loaded once per directory."""
    from specdraft.core.verifier import load_tokenizer

    return load_tokenizer(verifier)


def conversations(path: Path, n: int, reasoning: bool) -> Path:
    """``n`` chats (the last one two user turns); with ``reasoning``, every other answer carries
    ``reasoning_content``, as a Qwen3 server returns it."""
    with open(path, "w") as f:
        for i in range(n):
            answer = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(12 + 3 * i))
            turn = {"role": "assistant", "content": answer}
            if reasoning and i % 2 == 0:
                turn["reasoning_content"] = f"The user wants words; start at {WORDS[i]}."
            msgs = [{"role": "user", "content": f"Say words, round {i}."}, turn]
            if i == n - 1:
                msgs += [{"role": "user", "content": "Again."},
                         {"role": "assistant", "content": answer.upper()}]
            f.write(json.dumps({"id": f"c{i}", "messages": msgs}) + "\n")
    return path


@pytest.fixture(scope="module")
def qwen3_tokenizer_dir(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    """SmolLM2's tokenizer with Qwen3's think and tool tags as added tokens and
    :data:`QWEN3_TEMPLATE` as its chat template."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_TOKENS])
    tok.chat_template = QWEN3_TEMPLATE
    out = tmp_path_factory.mktemp("qwen3_tok")
    tok.save_pretrained(out)
    return out


def save_verifier(out: Path, family: str, tokenizer_dir: Path, **fields) -> Path:
    """:func:`tiny_model` of ``family`` (``fields`` override its config) with the tokenizer of
    ``tokenizer_dir``, saved as an HF directory."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = tiny_model(family, len(tok), bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **fields)
    model.save_pretrained(out)
    for f in Path(tokenizer_dir).iterdir():
        shutil.copy(f, out / f.name)
    return out


def write_config(path: Path, run_dir: Path, verifier: Path, data: Path) -> Path:
    cfg = {"run_dir": str(run_dir), "verifier": str(verifier),
           "generate": {"prompts": "builtin:demo_train"},
           # the Qwen3 template's empty think block before an answer without reasoning is
           # supervised here on purpose (test_think_markers_and_supervised_think_block)
           "prepare": {"data": str(data), "max_seq_len": 256, "allow_empty_think_scaffold": True},
           "vocab": {"draft_vocab_size": 256},
           "extract": {"storage": "fp32"},
           "train": {"max_steps": 3, "ttt_steps": 2, "warmup_steps": 1, "val_fraction": 0.25,
                     "eval_every": 3, "save_every": 3, "batch_tokens": 512},
           "export": {"format": "sglang"},
           "eval": {"prompts": "builtin:demo_eval", "limit": 2, "max_new_tokens": 8, "k": 2}}
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module", params=FAMILIES)
def family_run(request, tmp_path_factory, smollm2_tokenizer_dir, qwen3_tokenizer_dir):
    """``(family, run_dir, verifier_dir, model)`` after ``specdraft run --from prepare``."""
    from specdraft.core.verifier import load_verifier
    from specdraft.pipeline.config import PipelineConfig
    from specdraft.pipeline.run import run

    family = request.param
    tmp = tmp_path_factory.mktemp(family)
    qwen = family.startswith("qwen3")
    verifier = save_verifier(tmp / "verifier", family,
                             qwen3_tokenizer_dir if qwen else smollm2_tokenizer_dir)
    data = conversations(tmp / "chats.jsonl", 8, reasoning=qwen)
    cfg = write_config(tmp / "run.yaml", tmp / "run", verifier, data)
    manifest = run(PipelineConfig.from_yaml(cfg), from_stage="prepare")
    assert set(manifest["actions"].values()) == {"ran"} and len(manifest["actions"]) == 6
    return family, tmp / "run", verifier, load_verifier(verifier, dtype="float32")


def test_extracted_states_are_the_models_own(family_run):
    """Every stored row: aux = HF hidden_states[i], final = last_hidden_state at the supervised
    positions, and final @ lm_head.T = the model's logits there (fp32 storage)."""
    from specdraft.artifacts.hidden_states import DiskSource

    family, run_dir, _, model = family_run
    source = DiskSource(run_dir / "extract")
    assert len(source) == 9  # 8 chats, the last with two supervised turns
    for row in source.get_batch(range(len(source))):
        with torch.no_grad():
            out = model(row.input_ids[None], output_hidden_states=True)
        pos = row.target_positions
        hs = out.hidden_states
        want_aux = torch.cat([hs[i][0] for i in source.aux_layer_ids], dim=-1)
        torch.testing.assert_close(row.aux_hidden, want_aux, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(row.final_hidden, hs[-1][0, pos], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(row.final_hidden @ model.lm_head.weight.T,
                                   out.logits[0, pos], atol=1e-3, rtol=1e-4)


def test_teacher_check_passed_with_zero_gap(family_run):
    _, run_dir, _, _ = family_run
    check = json.loads((run_dir / "train" / "manifest.json").read_text())["teacher_check"]
    assert check["status"] == "passed" and check["problems"] == []
    assert len(check["teacher_rows"]) == 4 and len(check["band_rows"]) == 9
    assert check["kl_mean"] < 1e-6 and check["top1"] == 1.0


def test_export_loads_back_with_the_trained_tensors(family_run):
    from safetensors.torch import load_file

    from specdraft.artifacts.drafter import read_drafter

    _, run_dir, _, model = family_run
    exported = read_drafter(run_dir / "export" / "sglang")
    trained = load_file(str(run_dir / "train" / "best" / "drafter.safetensors"))
    extract = json.loads((run_dir / "extract" / "manifest.json").read_text())
    assert list(exported.config.aux_layer_ids) == extract["aux_layer_ids"]
    assert exported.config.target_hidden_size == model.config.hidden_size == 64
    assert exported.config.vocab_size == model.config.vocab_size
    for name in ("fc.weight", "lm_head.weight", "norm.weight", "d2t"):
        assert torch.equal(exported.state[name], trained[name]), name


def test_eval_counts_add_up_and_greedy_equals_plain_decoding(family_run):
    from specdraft.core.chat import run_chat_format
    from specdraft.eval.prompts import load_prompts, render

    _, run_dir, verifier, model = family_run
    results = json.loads((run_dir / "eval" / "results.json").read_text())
    assert results["mode"] == "offline" and len(results["prompts"]) == 2
    tok = tokenizer_of(verifier)
    fmt = run_chat_format(run_dir)
    for p, prompt in zip(results["prompts"], load_prompts("builtin:demo_eval", 2)):
        assert sum(p["per_position_accepted"]) == p["accepted"] <= p["drafted"]
        assert p["drafted"] == 2 * p["verify_steps"]
        assert p["committed"] == p["accepted"] + p["verify_steps"]
        assert p["new_tokens"] == len(p["tokens"]) <= 8
        ids = render(tok, prompt["messages"], fmt)
        assert p["tokens"] == greedy_reference(model, ids, len(p["tokens"]))
    steps = sum(p["verify_steps"] for p in results["prompts"])
    assert results["verify_steps"] == steps
    assert results["tau"] == pytest.approx(sum(p["committed"] for p in results["prompts"]) / steps)


def test_doctor_teacher_check_passes(family_run):
    from specdraft.doctor.config import DoctorConfig
    from specdraft.doctor.run import run as doctor

    _, run_dir, verifier, model = family_run
    report = doctor(DoctorConfig(target=run_dir, verifier=str(verifier)), verifier=model)
    (check,) = [c for c in report["checks"] if c["name"].startswith("stored teacher")]
    assert check["ok"], check["detail"]
    assert check["detail"].startswith("teacher check passed: mean KL(fresh || stored)")


def test_think_markers_and_supervised_think_block(family_run):
    """Qwen3 families: prepare found the template's think markers (single tokens) and every
    supervised turn starts with the think block the template renders (reasoning or empty);
    the other families have no think markers."""
    import datasets

    from specdraft.core.chat import run_chat_format

    family, run_dir, verifier, _ = family_run
    fmt = run_chat_format(run_dir)
    if not family.startswith("qwen3"):
        assert fmt.think is None
        return
    tok = tokenizer_of(verifier)
    opener, closer = tok.convert_tokens_to_ids(["<think>", "</think>"])
    assert (fmt.think.opener, fmt.think.closer) == ("<think>", "</think>")
    assert (fmt.think.opener_id, fmt.think.closer_id) == (opener, closer)
    ds = datasets.load_from_disk(str(run_dir / "prepare" / "dataset"))
    firsts = [row["input_ids"][row["loss_mask"].index(1)] for row in ds]
    assert firsts == [opener] * 9
    with_reasoning = [r for r in ds if r["sample_id"] == "c0"][0]
    text = tok.decode([t for t, m in zip(with_reasoning["input_ids"], with_reasoning["loss_mask"])
                       if m])
    assert text.startswith("<think>\nThe user wants words; start at alpha.\n</think>\n\nalpha beta")


def test_qwen3_template_renders_as_qwen3(qwen3_tokenizer_dir):
    """Golden rendering (written by hand from Qwen3's documented behaviour): tools in the system
    turn, reasoning kept only after the last real user query (inline <think> split off),
    tool calls and folded tool responses, and enable_thinking=false's empty think block."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    tool = {"type": "function", "function": {"name": "add", "parameters": {}}}
    chat = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "1+1?"},
            {"role": "assistant", "content": "2", "reasoning_content": "easy"},
            {"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": "<think>\nuse the tool\n</think>\n\n",
             "tool_calls": [{"type": "function", "function": {"name": "add",
                                                              "arguments": {"a": 2, "b": 3}}}]},
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "5", "reasoning_content": "the tool said 5"}]
    got = tok.apply_chat_template(chat, tools=[tool], tokenize=False)
    want = ("<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to "
            "assist with the user query.\n\nYou are provided with function signatures within "
            "<tools></tools> XML tags:\n<tools>\n" + json.dumps(tool) + "\n</tools>\n\nFor each "
            "function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
            "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n1+1?<|im_end|>\n"
            "<|im_start|>assistant\n2<|im_end|>\n"
            "<|im_start|>user\n2+3?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nuse the tool\n</think>\n\n<tool_call>\n{\"name\": "
            "\"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\nthe tool said 5\n</think>\n\n5<|im_end|>\n")
    assert got == want
    prompt = tok.apply_chat_template(chat[:2], tokenize=False, add_generation_prompt=True,
                                     enable_thinking=False)
    assert prompt.endswith("<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
                           "<think>\n\n</think>\n\n")
    assert tok.apply_chat_template(chat[:2], tokenize=False, add_generation_prompt=True) \
        .endswith("<|im_start|>assistant\n")


def test_planted_zero_rows_refused_by_train_cli_and_doctor(family_run, tmp_path, capsys):
    """One extracted row's aux layer zeroed on disk (as a broken extraction path writes it):
    `specdraft train` exits 2 with one line naming the row and layer, writes no manifest;
    the doctor's teacher check fails on the same run directory."""
    from safetensors.torch import load_file, save_file

    from specdraft.doctor.config import DoctorConfig
    from specdraft.doctor.run import run as doctor

    family, run_dir, verifier, model = family_run
    if family != "llama31":
        pytest.skip("planted once, on the Llama-3.1 run")
    bad = tmp_path / "run"
    for stage in ("prepare", "vocab", "extract", "train", "export"):
        shutil.copytree(run_dir / stage, bad / stage, ignore=shutil.ignore_patterns(".lock"))
    entry = json.loads((bad / "extract" / "index.jsonl").read_text().splitlines()[4])
    shard = bad / "extract" / entry["shard"]
    tensors = load_file(str(shard))
    start, H = entry["tok"], 64
    tensors["aux"][start:start + entry["seq_len"], H:2 * H] = 0  # aux id 3 of that row
    save_file(tensors, str(shard), metadata={"format": "pt"})
    report = doctor(DoctorConfig(target=bad, verifier=str(verifier)), verifier=model)
    (check,) = [c for c in report["checks"] if c["name"].startswith("stored teacher")]
    assert not check["ok"]
    assert f"row {entry['key']} aux id 3: {entry['seq_len']} of {entry['seq_len']} tokens " \
           f"all-zero" in check["detail"]
    shutil.rmtree(bad / "train")
    from specdraft.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:  # the real `specdraft` entry point
        main(["train", "--run-dir", str(bad), "--verifier", str(verifier), "--max-steps", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("specdraft: error: ") and "Traceback" not in err
    assert f"row {entry['key']} aux id 3: {entry['seq_len']} of {entry['seq_len']} tokens " \
           f"all-zero" in last
    assert not (bad / "train" / "manifest.json").exists()
