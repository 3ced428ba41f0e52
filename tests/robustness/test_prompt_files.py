"""Prompt files, as `specdraft generate --prompts` and `specdraft eval --prompts` read them
(one shared reader, :mod:`specdraft.artifacts.prompts`)."""

from __future__ import annotations

import json

import pytest

from malformed import final_names, write_lines
from specdraft.generate.fakeserver import LoopbackServer

Q1, Q2 = {"question": "What is 2+2?"}, {"question": "Name a colour."}

# (case, file name, content as bytes or a list of lines, what the error must name)
REFUSED = [
    ("invalid_utf8", "p.jsonl", [Q1, b'{"question": "caf\xe9"}'], ["p.jsonl:2", "not UTF-8"]),
    ("truncated_last_line", "p.jsonl", [Q1, '{"question": "Name a col'],
     ["p.jsonl:2", "not valid JSON"]),
    ("value_not_object", "p.jsonl", [[1, 2], Q1], ["p.jsonl:1", "expected a JSON object"]),
    # a file of bad rows only: generate stops on --max-reject-fraction naming the first rows
    # (eval refuses the first bad row)
    ("content_is_number", "p.jsonl", [{"messages": [{"role": "user", "content": 5}]}],
     ["p.jsonl:1", "must be a string or a list of text parts, got int"]),
    ("role_is_list", "p.jsonl", [{"messages": [{"role": ["user"], "content": "hi"}]}],
     ["p.jsonl:1", "'role' must be a string, got list"]),
    ("unknown_role", "p.jsonl", [{"messages": [{"role": "wizard", "content": "hi"}]}],
     ["p.jsonl:1", "unknown role 'wizard'"]),
    ("question_is_list", "p.jsonl", [{"question": ["a"]}], ["p.jsonl:1", "must be a string"]),
    ("empty_file", "p.jsonl", [], ["p.jsonl", "no prompt"]),
    ("blank_lines_only", "p.jsonl", ["", "  "], ["p.jsonl", "no prompt"]),
    ("no_prompt_field", "p.jsonl", [{"text": "hi"}], ["p.jsonl:1", "--field"]),
    ("json_invalid_utf8", "p.json", b'[{"question": "a"},\n {"question": "\xff"}]',
     ["p.json:2", "not UTF-8"]),
    ("json_not_json", "p.json", b'[{"question": "a"},\n {"question": ', ["p.json:2",
                                                                       "not valid JSON"]),
    ("json_not_a_list", "p.json", b'{"question": "a"}', ["p.json", "expected a JSON list"]),
    ("json_item_not_object", "p.json", b'["a"]', ["p.json[item 1]", "expected an object"]),
]


def _write(tmp_path, name, content, **kw):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
        return path
    return write_lines(path, content, **kw)


@pytest.fixture(scope="module")
def server():
    with LoopbackServer() as url:
        yield url


def _generate(cli, server, run_dir, prompts, *extra):
    return cli("generate", "--prompts", prompts, "--run-dir", run_dir, "--backend", "openai",
               "--endpoint", server, "--max-tokens", "8", *extra)


@pytest.mark.parametrize("case,name,content,needles", REFUSED, ids=[c[0] for c in REFUSED])
def test_generate_refuses_and_the_next_run_is_not_blocked(tmp_path, cli, server, case, name,
                                                          content, needles):
    run_dir = tmp_path / "run"
    res = _generate(cli, server, run_dir, _write(tmp_path, name, content))
    err = res.error
    assert all(n in err for n in needles), err
    assert "\n" not in err and len(err) < 600
    assert final_names(run_dir / "generate", "generate") == set()
    # the folder the failed start left does not block a corrected run (no --overwrite)
    good = write_lines(tmp_path / "good.jsonl", [Q1, Q2])
    ok = _generate(cli, server, run_dir, good)
    assert ok.code == 0, ok.err
    assert len((run_dir / "generate" / "samples.jsonl").read_text().splitlines()) == 2


EVAL_REFUSED = REFUSED


@pytest.mark.parametrize("case,name,content,needles", EVAL_REFUSED,
                         ids=[c[0] for c in EVAL_REFUSED])
def test_eval_refuses_the_same_files(tmp_path, cli, case, name, content, needles):
    res = cli("eval", "--prompts", _write(tmp_path, name, content), "--drafter",
              tmp_path / "no-drafter", "--out", tmp_path / "out")
    err = res.error
    assert all(n in err for n in needles), err
    assert not (tmp_path / "out").exists()


def test_fifty_megabyte_line_is_refused_by_line_without_echo(tmp_path, cli, server):
    path = tmp_path / "big.jsonl"
    path.write_bytes(json.dumps(Q1).encode() + b'\n{"question": "' + b"x" * (50 << 20) + b"\n")
    res = _generate(cli, server, tmp_path / "run", path)
    err = res.error
    assert "big.jsonl:2" in err and "not valid JSON" in err and len(err) < 600


@pytest.mark.parametrize("variant", ["bom", "crlf", "bom_crlf"])
def test_bom_and_crlf_read_like_the_plain_file(tmp_path, cli, server, variant):
    plain = write_lines(tmp_path / "plain.jsonl", [Q1, Q2])
    other = write_lines(tmp_path / f"{variant}.jsonl", [Q1, Q2], bom="bom" in variant,
                        eol="\r\n" if "crlf" in variant else "\n")
    assert _generate(cli, server, tmp_path / "a", plain).code == 0
    assert _generate(cli, server, tmp_path / "b", other).code == 0

    def ids(run):
        return [json.loads(x)["id"] for x in (run / "generate/samples.jsonl").read_text().split(
            "\n") if x]

    assert ids(tmp_path / "b") == ids(tmp_path / "a") and len(ids(tmp_path / "a")) == 2


def test_given_id_reused_is_a_counted_reject(tmp_path, cli, server):
    path = write_lines(tmp_path / "p.jsonl", [{"id": 7, **Q1}, {"id": 7, **Q2}])
    res = _generate(cli, server, tmp_path / "run", path)
    assert res.code == 0, res.err
    (rej,) = [json.loads(x) for x in (tmp_path / "run/generate/rejects.jsonl").read_text()
              .splitlines()]
    assert (rej["id"], rej["reason"], rej["source"]) == ("7", "duplicate_id", f"{path}:2")
    assert f"already used at {path}:1" in rej["detail"]


def test_repeated_rows_are_counted_rejects(tmp_path, cli, server):
    path = write_lines(tmp_path / "p.jsonl", [Q1, Q2, Q1])
    res = _generate(cli, server, tmp_path / "run", path)
    assert res.code == 0, res.err
    rejects = [json.loads(x) for x in (tmp_path / "run/generate/rejects.jsonl").read_text()
               .splitlines()]
    assert [(r["reason"], r["source"]) for r in rejects] == [("duplicate", f"{path}:3")]
    man = json.loads((tmp_path / "run/generate/manifest.json").read_text())
    assert man["counts"]["rejected"] == {"duplicate": 1} and man["counts"]["samples"] == 2
