"""Conversation files, as `specdraft prepare --data` reads them (:mod:`specdraft.prepare.records`):
a bad file is refused naming file and line; a bad record is a counted reject with its reason."""

from __future__ import annotations

import json

import pytest

from malformed import final_names, write_lines

GOOD = {"id": "good", "messages": [{"role": "user", "content": "Hi"},
                                   {"role": "assistant", "content": "Hello!"}]}
GOOD2 = {"id": "good2", "conversations": [{"from": "human", "value": "2+2?"},
                                          {"from": "gpt", "value": "4"}]}

# a template that renders the reasoning field inline, so a row shows what prepare supervises
THINK_RENDERING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content %}<think>{{ m.reasoning_content }}"
    "</think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

REFUSED = [
    ("invalid_utf8", "c.jsonl", [GOOD, b'{"id": "x", "messages": "\xc3\x28"}'],
     ["c.jsonl:2", "not UTF-8", "column"]),
    ("truncated_last_line", "c.jsonl", [GOOD, '{"id": "x", "messages": [{"role": "us'],
     ["c.jsonl:2", "not valid JSON"]),
    ("value_not_object", "c.jsonl", [GOOD, '"just a string"'],
     ["c.jsonl:2", "expected a JSON object, got str"]),
    ("empty_file", "c.jsonl", [], ["no row was produced", "c.jsonl", "no input turns"]),
    ("json_invalid_utf8", "c.json", b'[\n{"id": "\xfe"}]', ["c.json:2", "not UTF-8"]),
    ("json_not_json", "c.json", b'[{"id": 1},\n', ["c.json:2", "not valid JSON"]),
    ("json_item_not_object", "c.json", b'[1]', ["c.json[item 1]", "expected an object"]),
    ("json_not_a_list", "c.json", b'{"messages": []}', ["c.json", "expected a JSON list"]),
    ("missing_file", "absent.jsonl", None, ["--data", "absent.jsonl", "not found"]),
]

# (case, bad record, reason, detail fragment)
COUNTED = [
    ("content_is_number", {"id": "b", "messages": [{"role": "user", "content": 5}]},
     "bad_record", "message 0 'content' must be a string or a list of text parts, got int"),
    ("role_is_list", {"id": "b", "messages": [{"role": ["user"], "content": "x"}]},
     "bad_record", "message 0 'role' must be a string, got list"),
    ("unknown_role", {"id": "b", "messages": [{"role": "wizard", "content": "x"}]},
     "bad_record", "unknown role 'wizard'"),
    ("message_not_object", {"id": "b", "messages": ["hello"]}, "bad_record",
     "message 0 is a str"),
    ("unknown_sharegpt_role", {"id": "b", "conversations": [{"from": "alien", "value": "x"}]},
     "bad_record", "unknown ShareGPT role 'alien'"),
    ("messages_not_list", {"id": "b", "messages": "hi"}, "bad_record",
     "'messages' must be a non-empty list of messages"),
    ("turns_not_list", {"id": "b", **{k: GOOD[k] for k in ("messages",)}, "turns": 3},
     "bad_record", "'turns' must be a list"),
    ("id_is_object", {"id": {"a": 1}, "messages": GOOD["messages"]}, "bad_record",
     "'id' must be a string"),
    ("duplicate_id", {**GOOD2, "id": "good"}, "duplicate_id", "id seen before"),
    ("malformed_inline_think", {"id": "b", "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "<think>a</think>b</think>c"}]},
     "malformed_think", "2 </think> closers"),
]


@pytest.fixture
def prepare(prepare_cli):
    return lambda run_dir, data, *extra: prepare_cli(run_dir, data, "--max-seq-len", "64",
                                                     *extra)


def _write(tmp_path, name, content):
    path = tmp_path / name
    if content is None:
        return path
    if isinstance(content, bytes):
        path.write_bytes(content)
        return path
    return write_lines(path, content)


@pytest.mark.parametrize("case,name,content,needles", REFUSED, ids=[c[0] for c in REFUSED])
def test_bad_file_refused_and_the_next_run_is_not_blocked(tmp_path, prepare, case, name,
                                                          content, needles):
    run_dir = tmp_path / "run"
    err = prepare(run_dir, _write(tmp_path, name, content)).error
    assert all(n in err for n in needles), err
    assert final_names(run_dir / "prepare", "prepare") == set()
    ok = prepare(run_dir, write_lines(tmp_path / "good.jsonl", [GOOD]))
    assert ok.code == 0, ok.err
    assert json.loads((run_dir / "prepare/manifest.json").read_text())["counts"]["out"] == 1


@pytest.mark.parametrize("case,record,reason,detail", COUNTED, ids=[c[0] for c in COUNTED])
def test_bad_record_is_a_counted_reject(tmp_path, prepare, case, record, reason, detail):
    data = write_lines(tmp_path / "c.jsonl", [GOOD, record, GOOD2])
    res = prepare(tmp_path / "run", data)
    assert res.code == 0, res.err
    rejects = [json.loads(x) for x in (tmp_path / "run/prepare/rejects.jsonl").read_text()
               .splitlines()]
    assert len(rejects) == 1 and rejects[0]["reason"] == reason, rejects
    assert detail in rejects[0]["detail"], rejects
    if reason != "duplicate_id":  # a duplicate is named by its id; the others by file:line
        assert rejects[0]["where"] == f"{data}:2"
    man = json.loads((tmp_path / "run/prepare/manifest.json").read_text())
    assert man["counts"]["rejected"] == {reason: 1}
    assert man["summary"]["rejected_by_reason"] == {reason: 1}
    assert man["counts"]["out"] == 2  # the two good records around it


@pytest.mark.parametrize("variant", ["bom", "crlf"])
def test_bom_and_crlf_give_the_plain_files_dataset(tmp_path, prepare, variant):
    import datasets

    plain = write_lines(tmp_path / "plain.jsonl", [GOOD, GOOD2])
    other = write_lines(tmp_path / "o.jsonl", [GOOD, GOOD2], bom=variant == "bom",
                        eol="\r\n" if variant == "crlf" else "\n")
    assert prepare(tmp_path / "a", plain).code == 0
    assert prepare(tmp_path / "b", other).code == 0
    a, b = (datasets.load_from_disk(str(tmp_path / r / "prepare/dataset")) for r in "ab")
    assert a["input_ids"] == b["input_ids"] and a["sample_id"] == ["good", "good2"]


def test_fifty_megabyte_line_refused_by_line(tmp_path, prepare):
    path = tmp_path / "big.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"id": "big", "messages": "' +
                     b"y" * (50 << 20) + b"\n")
    err = prepare(tmp_path / "run", path).error
    assert "big.jsonl:2" in err and "not valid JSON" in err and len(err) < 600


def test_inline_think_counts_as_reasoning(tmp_path, prepare, smollm2_tokenizer_dir):
    from transformers import AutoTokenizer
    import datasets

    template = tmp_path / "t.jinja"
    template.write_text(THINK_RENDERING)
    record = {"id": "r", "messages": [{"role": "user", "content": "2+2?"},
                                      {"role": "assistant", "content": "<think>Add.</think>4"}]}
    plain = {"id": "p", "messages": [{"role": "user", "content": "Hi"},
                                     {"role": "assistant", "content": "Hello"}]}
    data = write_lines(tmp_path / "c.jsonl", [record, plain])
    res = prepare(tmp_path / "run", data, "--chat-template", template, "--require-reasoning")
    assert res.code == 0, res.err
    man = json.loads((tmp_path / "run/prepare/manifest.json").read_text())
    # the inline block is reasoning: kept; the turn without any is the one no_reasoning reject
    assert man["summary"]["with_reasoning"] == 1
    assert man["counts"]["rejected"] == {"no_reasoning": 1}
    row = datasets.load_from_disk(str(tmp_path / "run/prepare/dataset"))[0]
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    supervised = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]
    # what the model generated, as the template renders the split turn back
    assert tok.decode(supervised) == "<think>Add.</think>4<|im_end|>"


def test_no_row_error_names_the_rejects_at_their_final_name(tmp_path, prepare):
    """Every record rejected: the error names RUN/prepare/rejects.jsonl, which holds them (no
    temporary name is left), the stage stays incomplete, and the plain rerun the advice names
    (after fixing the data, no flag) replaces it."""
    bad = {"id": "b", "messages": [{"role": "wizard", "content": "x"}]}
    run_dir = tmp_path / "run"
    err = prepare(run_dir, write_lines(tmp_path / "c.jsonl", [bad, {**bad, "id": "c"}])).error
    final = run_dir / "prepare" / "rejects.jsonl"
    assert f"details in {final};" in err and "fix the data and rerun (the incomplete" in err, err
    assert "--overwrite" not in err, err
    assert [json.loads(x)["id"] for x in final.read_text().splitlines()] == ["b", "c"]
    assert not list((run_dir / "prepare").glob("*.tmp-*"))
    assert not (run_dir / "prepare" / "manifest.json").exists()
    ok = prepare(run_dir, write_lines(tmp_path / "good.jsonl", [GOOD]))
    assert ok.code == 0, ok.err
    assert final.read_text() == ""
    # a complete stage is still protected: the same plain rerun is refused now
    again = prepare(run_dir, write_lines(tmp_path / "good.jsonl", [GOOD]))
    assert "already holds complete output" in again.error
