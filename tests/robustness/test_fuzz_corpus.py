"""Replay of ``corpus/``: inputs that once crashed a reader (found by the fuzz suite or by hand),
each run through the real ``specdraft`` entry point in-process (drafter configs: through the two
drafter readers).

- ``corpus/prompts/*``: ``specdraft generate --prompts`` refuses with one ``specdraft: error:``
  line naming the file and line (exit 2) and writes nothing under generate's final names;
- ``corpus/conversations/*``: ``specdraft prepare --data`` either refuses the file (one line,
  exit 2) or counts every bad record as a reject with its reason;
- ``corpus/drafters/*``: a drafter config refused naming the file by both drafter readers;
- ``corpus/yaml/*``: ``specdraft prepare --config FILE`` refuses naming the file (exit 2), and
  never constructs a Python object from a tag.

Add a file to the folder when a new crash is found; the test picks it up.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fuzz import CORPUS
from malformed import final_names
from specdraft.generate.fakeserver import LoopbackServer


def _files(kind: str) -> list[Path]:
    return sorted((CORPUS / kind).iterdir())


@pytest.fixture(scope="module")
def server():
    with LoopbackServer() as url:
        yield url


@pytest.mark.parametrize("path", _files("prompts"), ids=lambda p: p.name)
def test_prompt_corpus_is_refused_by_line(tmp_path, cli, server, path):
    run_dir = tmp_path / "run"
    err = cli("generate", "--prompts", path, "--run-dir", run_dir, "--backend", "openai",
              "--endpoint", server, "--max-tokens", "4").error
    assert f"{path}:" in err and len(err) < 600, err
    assert final_names(run_dir / "generate", "generate") == set()


EXPECTED_REJECTS = {
    "kwargs_int": "'chat_template_kwargs' must be an object, got int",
    "ids_out_of_range": "completion_token_ids must be a list of token ids in [0, 49152)",
    "ids_not_ints": "completion_token_ids must be a list of token ids in [0, 49152)",
    "prompt_ids_int": "prompt_token_ids must be a list of token ids in [0, 49152)",
    "index_bool": "turn message_index True out of range",
    "tools_deep": "'tools' is not valid JSON",
    "function_call_deep": "function_call value is not JSON",
    "function_call_not_object": "function_call value is not a JSON object",
    "image_part": "part 0 is not a text part",
}


def test_conversation_corpus(tmp_path, cli, smollm2_tokenizer_dir):
    def prepare(run_dir, data):  # a corpus of bad records: each one counted, no stop
        return cli("prepare", "--run-dir", run_dir, "--tokenizer", smollm2_tokenizer_dir,
                   "--data", data, "--max-seq-len", "64", "--max-reject-fraction", "1")

    deep = CORPUS / "conversations" / "deep_nesting.jsonl"
    err = prepare(tmp_path / "a", deep).error
    assert f"{deep}:2" in err and "not valid JSON (nested too deeply" in err, err
    assert final_names(tmp_path / "a" / "prepare", "prepare") == set()

    bad = CORPUS / "conversations" / "bad_records.jsonl"
    res = prepare(tmp_path / "b", bad)
    assert res.code == 0, res.err
    rejects = [json.loads(x) for x in (tmp_path / "b/prepare/rejects.jsonl").read_text()
               .splitlines()]
    got = {r["id"].split("/")[0]: r for r in rejects}
    assert set(got) == set(EXPECTED_REJECTS), got
    reason = {rid: "unsupported_content" if rid == "image_part" else "bad_record"
              for rid in EXPECTED_REJECTS}
    for rid, detail in EXPECTED_REJECTS.items():
        assert got[rid]["reason"] == reason[rid] and detail in got[rid]["detail"], got[rid]
    man = json.loads((tmp_path / "b/prepare/manifest.json").read_text())
    assert man["counts"]["out"] == 1 and man["counts"]["rejected"] == {
        "bad_record": len(EXPECTED_REJECTS) - 1, "unsupported_content": 1}


YAML_NEEDLES = {
    "deep_nesting.yaml": "not valid YAML: nested too deeply",
    "alias_bomb.yaml": "more than 100000 values",
    "cyclic_alias.yaml": "nested deeper than 256 levels",
    "bad_timestamp.yaml": "day is out of range for month",
    "newline_key.yaml": "'\\n' ('\\n'): Extra inputs are not permitted",
    "python_object.yaml": "could not determine a constructor for the tag",
}


@pytest.mark.parametrize("path", _files("yaml"), ids=lambda p: p.name)
def test_yaml_corpus_is_refused(tmp_path, cli, path):
    err = cli("prepare", "--config", path, "--run-dir", tmp_path / "run").error
    assert str(path) in err and YAML_NEEDLES[path.name] in err and len(err) < 800, err
    assert not (tmp_path / "run" / "prepare").exists()


@pytest.mark.parametrize("path", _files("drafters"), ids=lambda p: p.name)
def test_drafter_corpus_is_refused(tmp_path, path):
    """``corpus/drafters/*``: a drafter config (valid weights absent) read by ``--drafter``
    (read_drafter) and by training resume (load_drafter): one line naming the file."""
    from specdraft.core.errors import InputError
    from specdraft.artifacts.drafter import read_drafter
    from specdraft.artifacts.drafter import load_drafter
    from specdraft.models.io import CONFIG_FILE, WEIGHTS_FILE

    (tmp_path / CONFIG_FILE).write_bytes(path.read_bytes())
    (tmp_path / WEIGHTS_FILE).write_bytes(b"")
    for read in (read_drafter, load_drafter):
        with pytest.raises(InputError) as err:
            read(tmp_path)
        assert str(tmp_path / CONFIG_FILE) in str(err.value) and "\n" not in str(err.value)
