"""`specdraft prepare` end to end on hand-built RUN/generate inputs."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from specdraft.core.errors import ConfigError
from specdraft.prepare.config import PrepareConfig
from specdraft.prepare.run import run


def _load(run_dir):
    import datasets

    return datasets.load_from_disk(str(run_dir / "prepare" / "dataset"))


def _rejects(run_dir):
    lines = (run_dir / "prepare" / "rejects.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def test_gsm8k_summary_matches_recount(tmp_path, shared_data, smollm2_tokenizer_dir,
                                       gen_helpers):
    write_generate, sample = gen_helpers
    rows = [json.loads(x) for x in (shared_data / "gsm8k" / "test.jsonl").open()][:20]
    records = [sample(f"gsm{i}", [{"role": "system", "content": "Solve the problem."},
                                  {"role": "user", "content": r["question"]},
                                  {"role": "assistant", "content": r["answer"]}])
               for i, r in enumerate(rows)]
    records[3]["messages"][2]["content"] += " " + "and so on " * 40  # cut at --max-seq-len
    records[5] = {"id": "broken", "messages": "not a list"}          # bad_record
    records[7]["messages"][1]["content"] *= 12                       # prompt too long
    write_generate(tmp_path, records)
    cfg = PrepareConfig(run_dir=str(tmp_path), tokenizer=str(smollm2_tokenizer_dir),
                        max_seq_len=300)
    manifest = run(cfg)
    fig = manifest["summary"]
    ds = _load(tmp_path)
    assert ds.column_names == ["input_ids", "loss_mask", "sample_id", "turn_index", "seq_len",
                               "truncated"]
    assert str(ds.features["input_ids"].feature.dtype) == "int32"
    assert str(ds.features["loss_mask"].feature.dtype) == "uint8"
    # independent recount from the written dataset and rejects
    ids = [np.array(x) for x in ds["input_ids"]]
    masks = [np.array(x) for x in ds["loss_mask"]]
    sup = np.concatenate([i[m == 1] for i, m in zip(ids, masks)])
    rejects = Counter(r["reason"] for r in _rejects(tmp_path))
    assert rejects == {"bad_record": 1, "too_long": 1}
    assert fig["samples_in"] == 20 and fig["tokenized"] == len(ds) == 18
    assert fig["rejected_by_reason"] == dict(rejects)
    assert fig["total_tokens"] == sum(len(i) for i in ids) == sum(ds["seq_len"])
    assert fig["supervised_tokens"] == len(sup)
    assert fig["avg_seq_len"] == round(sum(len(i) for i in ids) / 18, 3)
    assert fig["avg_response_len"] == round(len(sup) / 18, 3)
    assert fig["unique_tokens"] == len(np.unique(np.concatenate(ids)))
    assert fig["unique_supervised_tokens"] == len(np.unique(sup))
    assert fig["truncated"] == sum(ds["truncated"]) == 1
    assert fig["with_reasoning"] == 0
    # the rates use the stage's own elapsed time (rounded to 3 decimals)
    assert 0 < fig["elapsed_s"] <= manifest["elapsed_s"]
    assert fig["samples_per_s"] == pytest.approx(20 / fig["elapsed_s"], rel=1e-2)
    assert fig["tokens_per_s"] == pytest.approx(fig["total_tokens"] / fig["elapsed_s"], rel=1e-2)
    assert all(len(i) <= 300 for i in ids)
    # every untruncated row ends with <|im_end|> (id 2), supervised; every prompt is unsupervised
    for i, m, t in zip(ids, masks, ds["truncated"]):
        first = int(np.argmax(m))
        assert m[first:].all() and not m[:first].any()
        assert t or (i[-1] == 2 and m[-1] == 1)
    assert manifest["chat_format"]["stop_token_ids"] == [2]
    assert manifest["chat_format"]["think"] is None
    assert manifest["counts"]["rejected"] == dict(rejects)


def test_kwargs_reused_and_turns_last(tmp_path, think_tokenizer_dir, think_tokenizer,
                                      gen_helpers):
    write_generate, sample = gen_helpers
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Who are you?"},
            {"role": "assistant", "content": "I am a model."},
            {"role": "user", "content": "What is your name?"},
            {"role": "assistant", "content": "My name is Q."}]
    write_generate(tmp_path, [sample("a", msgs, kwargs={"enable_thinking": False})])
    manifest = run(PrepareConfig(run_dir=str(tmp_path), tokenizer=str(think_tokenizer_dir),
                                 turns="last"))
    ds = _load(tmp_path)
    assert len(ds) == 1 and ds[0]["turn_index"] == 1 and ds[0]["sample_id"] == "a"
    prompt = think_tokenizer.apply_chat_template(msgs[:4], tokenize=False,
                                                 add_generation_prompt=True,
                                                 enable_thinking=False)
    n = len(think_tokenizer(prompt, add_special_tokens=False)["input_ids"])
    sup = [i for i, m in zip(ds[0]["input_ids"], ds[0]["loss_mask"]) if m]
    assert think_tokenizer.decode(ds[0]["input_ids"][:n]) == prompt
    assert think_tokenizer.decode(sup) == "My name is Q.<|im_end|>"
    assert manifest["chat_template_kwargs"] == [{"kwargs": {"enable_thinking": False},
                                                 "samples": 1}]
    think = manifest["chat_format"]["think"]
    assert (think["opener_id"], think["closer_id"]) == (49152, 49153)
    assert manifest["chat_format"]["history_reasoning"] == "stripped"
    assert manifest["chat_format"]["supervised_reasoning"] == "rendered"
    assert 49152 in manifest["forced_token_ids"]["template_special"]


def test_data_file_sharegpt_and_require_reasoning(tmp_path, think_tokenizer_dir):
    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"id": "s1", "conversations": [{"from": "human", "value": "2+2?"},
                                       {"from": "gpt", "value": "4", "thinking": "Add."}]},
        {"id": "s2", "messages": [{"role": "user", "content": "Hi"},
                                  {"role": "assistant", "content": "Hello"}]},
        {"id": "s1", "messages": [{"role": "user", "content": "dup"},
                                  {"role": "assistant", "content": "dup"}]},
    ]) + "\n")
    run_dir = tmp_path / "run"
    manifest = run(PrepareConfig(run_dir=str(run_dir), tokenizer=str(think_tokenizer_dir),
                                 data=str(data), require_reasoning=True))
    assert manifest["summary"]["with_reasoning"] == 1
    assert manifest["counts"]["rejected"] == {"duplicate_id": 1, "no_reasoning": 1}
    assert [r["id"] for r in _rejects(run_dir)] == ["s2/0", "s1"]
    assert _load(run_dir)["sample_id"] == ["s1"]
    assert len(manifest["inputs"]["data"]) == 64


def test_empty_think_scaffold_refused_unless_asked(tmp_path, think_tokenizer_dir):
    """A thinking template writes "<think>\n\n</think>\n\n" before an answer without
    reasoning; with no server token ids nobody knows the model wrote it: the turn is a counted
    reject (empty_think_scaffold) naming the flag, and with --allow-empty-think-scaffold it is
    kept, supervised from the block on, and counted in the manifest's scaffolds."""
    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"id": "r", "messages": [{"role": "user", "content": "2+2?"},
                                 {"role": "assistant", "content": "4", "reasoning": "Add."}]},
        {"id": "n", "messages": [{"role": "user", "content": "Hi"},
                                 {"role": "assistant", "content": "Hello"}]},
    ]) + "\n")
    refused = run(PrepareConfig(run_dir=str(tmp_path / "a"), tokenizer=str(think_tokenizer_dir),
                                data=str(data)))
    assert refused["counts"]["rejected"] == {"empty_think_scaffold": 1}
    (reject,) = _rejects(tmp_path / "a")
    assert reject["id"] == "n/0" and "--allow-empty-think-scaffold" in reject["detail"]
    assert _load(tmp_path / "a")["sample_id"] == ["r"]

    kept = run(PrepareConfig(run_dir=str(tmp_path / "b"), tokenizer=str(think_tokenizer_dir),
                             data=str(data), allow_empty_think_scaffold=True))
    assert kept["counts"]["rejected"] == {}
    assert kept["summary"]["scaffolds"] == {"empty_think_scaffold": 1}
    row = _load(tmp_path / "b")[1]
    supervised = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]
    assert supervised[0] == 49152  # <think>: the template's block, supervised as asked


def test_configured_think_tokens_must_exist(tmp_path, smollm2_tokenizer_dir, gen_helpers):
    write_generate, sample = gen_helpers
    write_generate(tmp_path, [])
    with pytest.raises(ConfigError, match="--think-tokens"):
        run(PrepareConfig(run_dir=str(tmp_path), tokenizer=str(smollm2_tokenizer_dir),
                          think_tokens="<think>,</think>"))


def test_cli_prepare(tmp_path, smollm2_tokenizer_dir, gen_helpers):
    from typer.testing import CliRunner

    from specdraft.cli import app

    write_generate, sample = gen_helpers
    write_generate(tmp_path, [sample("x", [{"role": "user", "content": "Hi"},
                                           {"role": "assistant", "content": "Hello!"}])])
    res = CliRunner().invoke(app, ["prepare", "--run-dir", str(tmp_path), "--tokenizer",
                                   str(smollm2_tokenizer_dir), "--max-seq-len", "64"])
    assert res.exit_code == 0, res.output
    assert "tokenized: 1" in res.output and "supervised: 3" in res.output  # Hello ! <|im_end|>
    assert (tmp_path / "prepare" / "manifest.json").exists()
