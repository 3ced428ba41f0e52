"""Every row shape and container a user brings, read by `generate` (loopback server) and
`prepare --data` alike through the one reader (:mod:`specdraft.artifacts.prompts`): the exact
messages each stage yields, bad rows of each kind counted with reason and line while the good
rows are processed, and the stop on a mostly-rejected input."""

from __future__ import annotations

import gzip
import json

import pytest

from malformed import final_names, write_lines
from specdraft.generate.fakeserver import LoopbackServer

S = "Be brief."
# (id, row, the messages generate sends for the first turn, the data's answer or None)
SHAPES = [
    ("openai", {"id": "openai", "messages": [
        {"role": "system", "content": S}, {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"}]},
     [("system", S), ("user", "What is 2+2?")], "4"),
    ("sharegpt", {"id": "sharegpt", "conversations": [
        {"from": "human", "value": "Name a colour."}, {"from": "gpt", "value": "Blue."}]},
     [("user", "Name a colour.")], "Blue."),
    ("specforge", {"id": "specforge", "conversations": [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."}]},
     [("user", "Capital of France?")], "Paris."),
    ("alpaca", {"id": "alpaca", "instruction": "Translate to English.", "input": "Bonjour",
                "output": "Hello"},
     [("user", "Translate to English.\n\nBonjour")], "Hello"),
    ("alpaca_no_input", {"id": "alpaca_no_input", "instruction": "Say hi.", "input": "",
                         "output": "Hi"},
     [("user", "Say hi.")], "Hi"),
    ("mtbench", {"question_id": "mtbench", "turns": ["Write a haiku.", "Now shorter."]},
     [("user", "Write a haiku.")], None),
    ("question", {"id": "question", "question": "What is 3+3?", "system": S},
     [("system", S), ("user", "What is 3+3?")], None),
    ("prompt", {"id": "prompt", "prompt": "Hello there"}, [("user", "Hello there")], None),
]
ROWS = [row for _, row, _, _ in SHAPES]
CONTAINERS = ["jsonl", "json", "parquet", "jsonl.gz", "jsonl.zst", "save_to_disk"]


def write_container(tmp_path, kind, rows):
    """``rows`` written as ``kind``; Parquet and ``datasets`` store the mixed shapes as one
    schema, with nulls for the columns a row lacks (the reader treats null as absent)."""
    lines = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path = tmp_path / f"rows.{kind}"
    if kind == "jsonl":
        path.write_bytes(lines)
    elif kind == "json":
        path.write_text(json.dumps(rows))
    elif kind == "jsonl.gz":
        path.write_bytes(gzip.compress(lines))
    elif kind == "jsonl.zst":
        import zstandard

        path.write_bytes(zstandard.ZstdCompressor().compress(lines))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(_uniform(rows)), path)
    else:
        import datasets

        path = tmp_path / "rows_dir"
        datasets.Dataset.from_list(_uniform(rows)).save_to_disk(str(path))
    return path


def _uniform(rows):
    """Every column in every row (null where a row lacks it; pyarrow takes the columns from
    the first row), one type per column: ids as strings."""
    keys = sorted({k for r in rows for k in r})
    return [{k: (str(r[k]) if k in ("id", "question_id") and k in r else r.get(k))
             for k in keys} for r in rows]


@pytest.fixture(scope="module")
def server():
    srv = LoopbackServer()
    srv.start()
    yield srv
    srv.stop()


def _generate(cli, server, run_dir, prompts, *extra):
    return cli("generate", "--prompts", prompts, "--run-dir", run_dir, "--backend", "openai",
               "--endpoint", server.url, "--max-tokens", "8", *extra)


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _sent(bodies):
    """First-turn messages sent per sample, keyed by its last user text."""
    return [[(m["role"], m["content"]) for m in b["messages"]] for b in bodies]


@pytest.mark.parametrize("kind", CONTAINERS)
def test_generate_reads_every_shape_from_every_container(tmp_path, cli, server, kind):
    path = write_container(tmp_path, kind, ROWS)
    before = len(server.chat_bodies)
    res = _generate(cli, server, tmp_path / "run", path)
    assert res.code == 0, res.err
    sent = _sent(server.chat_bodies[before:])
    for _, _, first, _ in SHAPES:
        assert first in sent, (first, sent)
    # MT-bench's second turn carries the verifier's own first answer, not the data's
    assert [("user", "Write a haiku."), ("assistant", "Answer to: Write a haiku."),
            ("user", "Now shorter.")] in sent
    assert len(sent) == len(SHAPES) + 1
    samples = {s["id"]: s for s in _lines(tmp_path / "run/generate/samples.jsonl")}
    assert sorted(samples) == sorted(name for name, *_ in SHAPES)
    assert [(m["role"], m["content"]) for m in samples["alpaca"]["messages"]] == [
        ("user", "Translate to English.\n\nBonjour"),
        ("assistant", "Answer to: Translate to English.\n\nBonjour")]
    assert (tmp_path / "run/generate/rejects.jsonl").read_text() == ""


@pytest.fixture
def prepare(prepare_cli):
    return lambda run_dir, data, *extra: prepare_cli(run_dir, data, "--max-seq-len", "256",
                                                     *extra)


@pytest.mark.parametrize("kind", CONTAINERS)
def test_prepare_reads_every_shape_from_every_container(tmp_path, prepare, smollm2_tokenizer_dir,
                                                        kind):
    import datasets
    from transformers import AutoTokenizer

    res = prepare(tmp_path / "run", write_container(tmp_path, kind, ROWS))
    assert res.code == 0, res.err
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    rows = {r["sample_id"]: r for r in datasets.load_from_disk(
        str(tmp_path / "run/prepare/dataset"))}
    answered = [(name, first, answer) for name, _, first, answer in SHAPES if answer]
    assert sorted(rows) == sorted(name for name, _, _ in answered)
    for name, first, answer in answered:
        row = rows[name]
        # the whole row is the template's rendering of the expected messages, and only the
        # data's answer (with its end-of-turn token) is supervised
        messages = [{"role": r, "content": c} for r, c in first]
        want = tok.apply_chat_template(messages + [{"role": "assistant", "content": answer}],
                                       tokenize=False)
        assert tok.decode(row["input_ids"]) == want.rstrip("\n"), name
        supervised = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]
        assert tok.decode(supervised) == answer + "<|im_end|>", name
    rejects = _lines(tmp_path / "run/prepare/rejects.jsonl")
    # prompt-only shapes have no answer to train on: counted, never silently skipped
    assert sorted((r["id"], r["reason"]) for r in rejects) == [
        ("mtbench", "no_answer"), ("prompt", "no_answer"), ("question", "no_answer")]


GOOD = [{"id": f"g{i}", "messages": [{"role": "user", "content": f"Question {i}?"},
                                     {"role": "assistant", "content": f"Answer {i}."}]}
        for i in range(7)]
CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
# (case, the line as written, reason, detail fragment) — each bad in generate and prepare alike
BAD = [
    ("empty_user_turn", {"id": "b_empty", "messages": [
        {"role": "user", "content": "  "}, {"role": "assistant", "content": "x"}]},
     "empty_turn", "message 0: empty user turn"),
    ("assistant_first", {"id": "b_order", "messages": [
        {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "Q?"},
        {"role": "assistant", "content": "A."}]},
     "bad_order", "starts with a assistant turn"),
    ("image_part", {"id": "b_image", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]},
        {"role": "assistant", "content": "A cat."}]},
     "unsupported_content", "part 0 is not a text part"),
    ("lone_surrogate", '{"id": "b_surrogate", "messages": [{"role": "user", "content": '
                       '"a\\ud800b"}, {"role": "assistant", "content": "x"}]}',
     "bad_text", "lone surrogate \\ud800"),
    ("tool_turns", {"id": "b_tool", "messages": [
        {"role": "user", "content": "Add."},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "assistant", "content": "4."}]},
     "tool_calls_unsupported", ""),
    ("no_prompt_field", {"id": "b_field", "text": "x"}, "bad_record", "--field KIND=COLUMN"),
]


# generate answers the tool-calling row (its call and result kept, the answer after them
# regenerated); prepare still rejects its call turn, which SmolLM2's template does not render
TOOL_ROW = "b_tool"


def _bad_file(tmp_path):
    lines = [GOOD[0]] + [line for _, line, _, _ in BAD] + GOOD[1:]
    return write_lines(tmp_path / "mixed.jsonl", lines)


def test_generate_counts_each_bad_row_and_answers_the_good_ones(tmp_path, cli, server):
    path = _bad_file(tmp_path)
    before = len(server.chat_bodies)
    res = _generate(cli, server, tmp_path / "run", path)
    assert res.code == 0, res.err
    samples = _lines(tmp_path / "run/generate/samples.jsonl")
    assert sorted(s["id"] for s in samples) == sorted([g["id"] for g in GOOD] + [TOOL_ROW])
    rejects = {r["id"]: r for r in _lines(tmp_path / "run/generate/rejects.jsonl")}
    for line, (case, row, reason, detail) in enumerate(BAD, 2):
        rid = json.loads(row)["id"] if isinstance(row, str) else row["id"]
        if rid == TOOL_ROW:
            continue
        r = rejects.pop(rid)
        assert (r["reason"], r["source"]) == (reason, f"{path}:{line}"), case
        assert detail in r["detail"], (case, r["detail"])
    assert rejects == {}
    # no bad row reached the server (the tool row's one regenerated answer did)
    assert len(server.chat_bodies) - before == len(GOOD) + 1
    man = json.loads((tmp_path / "run/generate/manifest.json").read_text())
    assert man["counts"]["rejected"] == {reason: 1 for _, row, reason, _ in BAD
                                         if not (isinstance(row, dict) and row["id"] == TOOL_ROW)}
    assert man["counts"]["rows_in"] == len(GOOD) + len(BAD)


def test_prepare_counts_each_bad_row_and_keeps_the_good_ones(tmp_path, prepare):
    path = _bad_file(tmp_path)
    res = prepare(tmp_path / "run", path)
    assert res.code == 0, res.err
    man = json.loads((tmp_path / "run/prepare/manifest.json").read_text())
    # the good rows, and the answer after the tool result (only the call turn is unsupported)
    assert man["counts"]["out"] == len(GOOD) + 1
    rejects = {r["id"].split("/")[0]: r for r in _lines(tmp_path / "run/prepare/rejects.jsonl")}
    for line, (case, row, reason, detail) in enumerate(BAD, 2):
        rid = json.loads(row)["id"] if isinstance(row, str) else row["id"]
        r = rejects.pop(rid)
        assert r["reason"] == reason, (case, r)
        if reason != "tool_calls_unsupported":  # a turn's reject: named by sample/turn
            assert r["where"] == f"{path}:{line}", case
            assert detail in r["detail"], (case, r["detail"])
    assert rejects == {}


def test_mostly_rejected_input_stops_before_any_request(tmp_path, cli, server):
    lines = [GOOD[0]] + [line for _, line, _, _ in BAD[:3]]
    path = write_lines(tmp_path / "bad.jsonl", lines)
    before = len(server.chat_bodies)
    err = _generate(cli, server, tmp_path / "run", path).error
    assert err.startswith("3 of 4 input rows rejected (75%, more than --max-reject-fraction "
                          "0.5): {'bad_order': 1, 'empty_turn': 1, 'unsupported_content': 1}")
    assert f"{path}:2: message 0: empty user turn" in err
    assert len(server.chat_bodies) == before
    assert final_names(tmp_path / "run/generate", "generate") == set()
    # the limit is a flag; raised, the same input runs and counts its rejects
    res = _generate(cli, server, tmp_path / "run", path, "--max-reject-fraction", "0.8")
    assert res.code == 0, res.err
    assert len(_lines(tmp_path / "run/generate/rejects.jsonl")) == 3


def test_prepare_mostly_rejected_stops_with_the_counts(tmp_path, prepare):
    lines = [GOOD[0]] + [line for _, line, _, _ in BAD[:3]]
    run_dir = tmp_path / "run"
    err = prepare(run_dir, write_lines(tmp_path / "bad.jsonl", lines)).error
    assert err.startswith("prepare: 3 of 4 input turns (and records rejected whole) rejected "
                          "(75%, more than --max-reject-fraction 0.5): {'bad_order': 1, "
                          "'empty_turn': 1, 'unsupported_content': 1}"), err
    assert not (run_dir / "prepare/manifest.json").exists()
    fixed = write_lines(tmp_path / "fixed.jsonl", GOOD)
    ok = prepare(run_dir, fixed)  # the plain rerun the advice names
    assert ok.code == 0, ok.err


def test_hub_dataset_name_gets_the_recipe(tmp_path, cli, server, prepare):
    err = _generate(cli, server, tmp_path / "run", "tatsu-lab/alpaca").error
    assert "--prompts tatsu-lab/alpaca: no such file or directory" in err
    assert "datasets.load_dataset('tatsu-lab/alpaca', split='train').to_json(" in err
    err = prepare(tmp_path / "run", "tatsu-lab/alpaca").error
    assert "--data tatsu-lab/alpaca" in err and "load_dataset" in err


def test_field_maps_alpaca_columns(tmp_path, cli, server, prepare):
    """--field renames every kind in both stages (prepare has it too)."""
    path = write_lines(tmp_path / "a.jsonl", [{"id": "x", "task": "Sum 1 and 2.",
                                               "context": "Be exact.", "answer": "3"}])
    maps = ["--field", "instruction=task", "--field", "input=context", "--field",
            "output=answer"]
    before = len(server.chat_bodies)
    assert _generate(cli, server, tmp_path / "g", path, *maps).code == 0
    assert _sent(server.chat_bodies[before:]) == [[("user", "Sum 1 and 2.\n\nBe exact.")]]
    assert prepare(tmp_path / "p", path, *maps).code == 0


def test_resume_does_not_count_bad_rows_twice(tmp_path, cli, server):
    path = _bad_file(tmp_path)
    assert _generate(cli, server, tmp_path / "run", path).code == 0
    rejects = (tmp_path / "run/generate/rejects.jsonl").read_text()
    before = len(server.chat_bodies)
    res = _generate(cli, server, tmp_path / "run", path, "--resume")
    assert res.code == 0, res.err
    assert (tmp_path / "run/generate/rejects.jsonl").read_text() == rejects
    assert len(server.chat_bodies) == before  # every good row was done
    man = json.loads((tmp_path / "run/generate/manifest.json").read_text())
    assert man["counts"]["rejected"] == {reason: 1 for _, row, reason, _ in BAD
                                         if not (isinstance(row, dict) and row["id"] == TOOL_ROW)}
