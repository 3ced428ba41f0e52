"""Prompt files: every accepted shape, field mapping, stable ids, clear errors."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specdraft.core.errors import InputError
from specdraft.artifacts.prompts import read_prompts, sample_id

KW = dict(fields={"messages": "messages", "conversations": "conversations", "turns": "turns",
                  "question": "question", "prompt": "prompt", "system": "system", "id": "id"},
          sampling={"temperature": 0.0, "top_p": 1.0, "max_tokens": 16},
          chat_template_kwargs={})


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_all_shapes(tmp_path):
    rows = [
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"},
                      {"role": "assistant", "content": "old"}, {"role": "user", "content": "u2"}]},
        {"conversations": [{"from": "human", "value": "h1"}, {"from": "gpt", "value": "g"}]},
        {"question_id": 81, "turns": ["t1", "t2"]},
        {"question": "q", "answer": "ignored"},
        {"prompt": "p", "id": "given"},
    ]
    read = read_prompts(_jsonl(tmp_path / "p.jsonl", rows), **KW)
    prompts, dups = read.prompts, read.duplicates
    got = [(p.system, p.turns) for p in prompts]
    assert got == [("S", ("u1", "u2")), (None, ("h1",)), (None, ("t1", "t2")),
                   (None, ("q",)), (None, ("p",))]
    assert prompts[2].id == "81" and prompts[4].id == "given" and dups == []
    assert prompts[3].id == sample_id(None, ["q"], KW["sampling"], {})
    assert prompts[3].source == f"{tmp_path / 'p.jsonl'}:4"


def test_id_is_stable_and_depends_on_sampling():
    a = sample_id("S", ["q"], {"temperature": 0.0}, {})
    assert a == sample_id("S", ("q",), {"temperature": 0.0}, {})
    assert a != sample_id("S", ["q"], {"temperature": 0.7}, {})
    assert a != sample_id(None, ["q"], {"temperature": 0.0}, {})
    assert len(a) == 20


def test_field_mapping_and_parquet(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"problem": ["x", "y"], "uid": ["a", "b"]}), path)
    kw = {**KW, "fields": {**KW["fields"], "question": "problem", "id": "uid"}}
    prompts = read_prompts(path, **kw).prompts
    assert [(p.id, p.turns, p.source) for p in prompts] == [
        ("a", ("x",), f"{path}[row 1]"), ("b", ("y",), f"{path}[row 2]")]


def test_json_list(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps([{"prompt": "a"}, {"prompt": "b"}]))
    assert [p.turns for p in read_prompts(path, **KW).prompts] == [("a",), ("b",)]


def test_duplicates_are_returned_not_dropped(tmp_path):
    read = read_prompts(_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "b"},
                                                       {"prompt": "a"}]), **KW)
    prompts, dups = read.prompts, read.duplicates
    assert [p.turns for p in prompts] == [("a",), ("b",)]
    assert [(d.id, d.source) for d in dups] == [(prompts[0].id, f"{tmp_path / 'p.jsonl'}:3")]


@pytest.mark.parametrize("row,reason,msg", [
    ({"text": "x"}, "bad_record", r"p.jsonl:2: no prompt field; map one with --field KIND=COLUMN"),
    ({"conversations": [{"from": "robot", "value": "x"}]}, "bad_record",
     r"p.jsonl:2: .*unknown ShareGPT role 'robot'"),
    ({"turns": []}, "bad_record", r"p.jsonl:2: 'turns' must be a non-empty list"),
    ({"question": 5}, "bad_record", r"p.jsonl:2: 'question' must be a string"),
    ({"prompt": "  "}, "empty_turn", r"p.jsonl:2: message 0: empty user turn"),
])
def test_bad_rows_are_returned_with_reason_and_line(tmp_path, row, reason, msg):
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "ok"}, row])
    read = read_prompts(path, **KW)
    assert [p.turns for p in read.prompts] == [("ok",)] and read.rows == 2
    assert [e.reason for e in read.rejected] == [reason]
    with pytest.raises(InputError, match=msg):
        raise read.rejected[0]


def test_given_id_reused_for_other_prompt_is_a_reject(tmp_path):
    path = _jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}])
    read = read_prompts(path, **KW)
    assert [p.turns for p in read.prompts] == [("x",)]
    (err,) = read.rejected
    assert (err.reason, err.sample_id) == ("duplicate_id", "a")
    assert re.search(r"p.jsonl:2: id 'a' already used at .*p.jsonl:1", str(err))


@pytest.mark.parametrize("values,msg", [
    ({"backend": "openai"}, "--endpoint .*needs at least one --endpoint URL"),
    ({"resume": True, "overwrite": True}, "--overwrite .*exclude each other"),
    ({"endpoint": ["gpu1:8000"]}, "--endpoint .*not an http"),
    ({"fields": {"questoin": "q"}}, "--fields .*unknown field kind"),
])
def test_config_errors_name_the_flag(values, msg):
    from specdraft.core.errors import ConfigError
    from specdraft.generate.config import GenerateConfig

    with pytest.raises(ConfigError, match=msg):
        GenerateConfig.build({"prompts": "p.jsonl", "run_dir": "r", **values})
