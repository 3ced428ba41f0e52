"""The fuzz property end to end: mutated real files through ``specdraft generate --prompts`` and
``specdraft prepare --data`` (the real entry point, in-process, so each example is cheap).

Property: exit 0, or exit 2 with one ``specdraft: error:`` line naming the file and no
traceback; after an exit 2 nothing is new under the stage's final names, except prepare's
``rejects.jsonl`` when no row was produced (the error names it); after an exit 0 every input
record is a sample or a counted reject.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz import examples, jsonl_of_records, mutated_files
from malformed import final_names
from specdraft.generate.fakeserver import LoopbackServer


@pytest.fixture(scope="module")
def server():
    with LoopbackServer() as url:
        yield url


def _lines(path) -> list[str]:
    return [x for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


@examples(25)
@given(data=mutated_files() | jsonl_of_records)
def test_generate_prompts(tmp_path_factory, cli, server, data):
    tmp = tmp_path_factory.mktemp("g")
    prompts = tmp / "p.jsonl"
    prompts.write_bytes(data)
    run_dir = tmp / "run"
    res = cli("generate", "--prompts", prompts, "--run-dir", run_dir, "--backend", "openai",
              "--endpoint", server, "--max-tokens", "4")
    if res.code == 2:
        assert "p.jsonl" in res.error
        assert final_names(run_dir / "generate", "generate") == set()
        return
    assert res.code == 0 and "Traceback" not in res.err, res.err
    out = run_dir / "generate"
    man = json.loads((out / "manifest.json").read_text())
    assert len(_lines(out / "samples.jsonl")) == man["counts"]["samples"]
    assert len(_lines(out / "rejects.jsonl")) == sum(man["counts"]["rejected"].values())


@examples(15)
@given(data=mutated_files() | jsonl_of_records)
def test_prepare_data(tmp_path_factory, cli, smollm2_tokenizer_dir, data):
    tmp = tmp_path_factory.mktemp("c")
    path = tmp / "c.jsonl"
    path.write_bytes(data)
    run_dir = tmp / "run"
    res = cli("prepare", "--run-dir", run_dir, "--tokenizer", smollm2_tokenizer_dir, "--data",
              path, "--max-seq-len", "64")
    out = run_dir / "prepare"
    if res.code == 2:
        err = res.error
        assert "c.jsonl" in err, err
        allowed = {"rejects.jsonl"} if "no row was produced" in err else set()
        assert final_names(out, "prepare") <= allowed
        if allowed and final_names(out, "prepare"):
            assert str(out / "rejects.jsonl") in err
        return
    assert res.code == 0 and "Traceback" not in res.err, res.err
    man = json.loads((out / "manifest.json").read_text())
    rejected = sum(man["counts"]["rejected"].values())
    assert len(_lines(out / "rejects.jsonl")) == rejected
    assert man["counts"]["out"] + rejected >= 1


@examples(40)
@given(text=st.text(max_size=40) | st.sampled_from(["[" * 100000, "{" * 5000, "&a [*a]",
                                                     "!!python/object:os.system x", "1e999"]),
       flag=st.sampled_from(["--chat-template-kwargs", "--max-seq-len", "--stop-tokens",
                             "--think-tokens"]))
def test_flag_values(tmp_path_factory, cli, text, flag):
    """Any text in a JSON- or YAML-parsed flag: exit 2 with one clear error line (ours, or
    click's usage error for a value its own type check refuses; the --data file is missing, so
    a valid value ends at that error), never a traceback."""
    tmp = tmp_path_factory.mktemp("f")
    res = cli("prepare", "--run-dir", tmp / "run", "--data", tmp / "absent.jsonl", flag, text)
    lines = [x for x in res.err.splitlines() if x.strip()]
    assert res.code == 2 and "Traceback" not in res.err + res.out, res.err
    assert lines[-1].startswith(("specdraft: error: ", "Error: Invalid value")), res.err
