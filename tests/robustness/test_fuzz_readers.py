"""Property-based fuzzing of every reader of user files (Hypothesis; profile in ``fuzz.py``).

Property: whatever the bytes, a reader returns, or raises the project's clear error type
(:class:`~specdraft.core.errors.SpecdraftError`, which ``specdraft`` prints as one
``specdraft: error:`` line with exit 2) whose message names the file; a per-record reader
(prepare) counts every bad record as a reject and never raises. Any other exception (a
``RecursionError`` out of ``json``, a ``KeyError``, a ``TypeError``) fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz import any_bytes, examples, json_values, jsonl_of_records, jsonl_of_values, records
from specdraft.core.errors import SpecdraftError

FIELDS = {k: k for k in ("messages", "conversations", "turns", "question", "prompt", "id",
                         "system")}


def _write(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def _clear_or_named(fn, path: Path):
    """``fn()``'s value, or None after a :class:`SpecdraftError` naming ``path``'s file."""
    try:
        return fn()
    except SpecdraftError as err:
        assert path.name in str(err), err
        assert "\n" not in str(err).strip() and len(str(err)) < 2000, err
        return None


@examples(120)
@given(data=any_bytes | jsonl_of_values)
def test_jsonl_lines(tmp_path_factory, data):
    from specdraft.core.jsonl import iter_jsonl

    path = _write(tmp_path_factory.mktemp("j"), "x.jsonl", data)
    rows = _clear_or_named(lambda: list(iter_jsonl(path)), path)
    assert rows is None or all(isinstance(r, dict) for _, r in rows)


@examples(80)
@given(data=any_bytes | jsonl_of_values)
def test_json_files(tmp_path_factory, data):
    from specdraft.core.jsonl import read_json

    path = _write(tmp_path_factory.mktemp("j"), "x.json", data)
    _clear_or_named(lambda: read_json(path), path)


@examples(120)
@given(data=any_bytes | jsonl_of_values | jsonl_of_records,
       suffix=st.sampled_from([".jsonl", ".json"]))
def test_prompt_files(tmp_path_factory, data, suffix):
    """``generate --prompts`` / ``eval --prompts``: the one prompt reader."""
    from specdraft.generate.inputs import read_prompts

    path = _write(tmp_path_factory.mktemp("p"), f"p{suffix}", data)
    got = _clear_or_named(lambda: read_prompts(path, fields=FIELDS, sampling={},
                                               chat_template_kwargs={}), path)
    if got is not None:
        unique, _ = got
        assert unique and all(p.turns and all(isinstance(t, str) for t in p.turns)
                              for p in unique)


@examples(80)
@given(data=any_bytes | jsonl_of_values | jsonl_of_records,
       suffix=st.sampled_from([".jsonl", ".json"]))
def test_conversation_files_read(tmp_path_factory, data, suffix):
    """``prepare --data`` file level: a file-level problem is one clear error."""
    from specdraft.prepare.records import iter_records

    path = _write(tmp_path_factory.mktemp("c"), f"c{suffix}", data)
    _clear_or_named(lambda: list(iter_records(path)), path)


@pytest.fixture(scope="module")
def prepare_job(smollm2_tokenizer_dir, tmp_path_factory):
    """A prepare job over the SmolLM2 tokenizer (built once; records are added one by one)."""
    from specdraft.prepare.config import PrepareConfig
    from specdraft.prepare.run import start_job

    out = tmp_path_factory.mktemp("prep")
    config = PrepareConfig(run_dir=str(out), tokenizer=str(smollm2_tokenizer_dir),
                           data=str(out / "unused.jsonl"), max_seq_len=64)
    job, _, _ = start_job(config, out)
    yield job
    job.writer.abort()


@examples(150)
@given(record=st.dictionaries(st.text(max_size=8), json_values, max_size=4) | records)
def test_conversation_records_are_rows_or_counted_rejects(prepare_job, record):
    """``prepare`` per record: never an exception; every supervised turn it finds is a row or
    a counted reject, and a record it cannot read is one counted reject."""
    job = prepare_job
    rows, rejects, turns = job.writer.count, job.rejects.total, job.summary.turns_in
    job.add_record("c.jsonl:1", record)
    new_rows, new_rejects = job.writer.count - rows, job.rejects.total - rejects
    new_turns = job.summary.turns_in - turns
    assert new_rows + new_rejects == max(new_turns, 1) or new_turns == 0 == new_rejects
    job.rejects.flush()
    for row in job.writer._rows:
        assert len(row["input_ids"]) == len(row["loss_mask"]) == row["seq_len"] <= 64
        assert all(0 <= t < job.summary.vocab_size for t in row["input_ids"])
    job.writer._flush()


@examples(80)
@given(data=any_bytes | jsonl_of_values)
def test_yaml_configs(tmp_path_factory, data):
    """``--config FILE.yaml`` for every stage: read, then validated into the stage config."""
    from specdraft.generate.config import GenerateConfig
    from specdraft.prepare.config import PrepareConfig
    from specdraft.train.config import TrainConfig

    path = _write(tmp_path_factory.mktemp("y"), "c.yaml", data)
    for cls, section in ((GenerateConfig, "generate"), (PrepareConfig, "prepare"),
                         (TrainConfig, "train")):
        _config_or_error(cls, section, path)


def _config_or_error(cls, section, path):
    from specdraft.cli.common import build_config

    try:
        build_config(cls, config_file=path, section=section, flags={})
    except SpecdraftError as err:
        assert "\n" not in str(err).strip(), err


yaml_mappings = st.dictionaries(
    st.sampled_from(["run_dir", "verifier", "prepare", "generate", "train", "max_seq_len",
                     "lr", "epochs", "data", "prompts", "chat_template_kwargs", "turns",
                     "x"]), json_values, max_size=5)


@examples(80)
@given(mapping=yaml_mappings)
def test_yaml_config_values(tmp_path_factory, mapping):
    import yaml

    path = tmp_path_factory.mktemp("y") / "c.yaml"
    path.write_text(yaml.safe_dump(mapping))
    from specdraft.generate.config import GenerateConfig
    from specdraft.prepare.config import PrepareConfig
    from specdraft.train.config import TrainConfig

    for cls, section in ((GenerateConfig, "generate"), (PrepareConfig, "prepare"),
                         (TrainConfig, "train")):
        _config_or_error(cls, section, path)
