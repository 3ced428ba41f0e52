"""Property-based fuzzing of every reader of user files (Hypothesis; profile in ``fuzz.py``).

Property: whatever the bytes, a reader returns, or raises the project's clear error type
(:class:`~specdraft.core.errors.SpecdraftError`, which ``specdraft`` prints as one
``specdraft: error:`` line with exit 2) whose message names the file; a per-record reader
(prepare) counts every bad record as a reject and never raises. Any other exception (a
``RecursionError`` out of ``json``, a ``KeyError``, a ``TypeError``) fails the test.
"""

from __future__ import annotations

import json
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
    from specdraft.artifacts.prompts import read_prompts

    path = _write(tmp_path_factory.mktemp("p"), f"p{suffix}", data)
    got = _clear_or_named(lambda: read_prompts(path, fields=FIELDS, sampling={},
                                               chat_template_kwargs={}), path)
    if got is not None:  # every row is a prompt, a repeat or a counted reject with a reason
        assert got.rows == len(got.prompts) + len(got.duplicates) + len(got.rejected) > 0
        assert all(p.turns and all(isinstance(t, str) for t in p.turns) for p in got.prompts)
        assert all(e.reason and path.name in str(e) for e in got.rejected)


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


@examples(40)
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


def _real_drafter_config() -> dict:
    from dataclasses import asdict

    from specdraft.models.eagle3 import Eagle3Config

    return asdict(Eagle3Config(hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
                               head_dim=4, intermediate_size=16, rms_norm_eps=1e-5,
                               rope_theta=1e4, max_position_embeddings=64, vocab_size=40,
                               draft_vocab_size=10, target_hidden_size=8,
                               aux_layer_ids=(1, 2, 3)))


@st.composite
def drafter_configs(draw) -> bytes:
    """A real drafter config with keys dropped, retyped or replaced by arbitrary values."""
    cfg = _real_drafter_config()
    for key in draw(st.lists(st.sampled_from(sorted(cfg)), max_size=3, unique=True)):
        if draw(st.booleans()):
            del cfg[key]
        else:
            cfg[key] = draw(json_values)
    cfg.update(draw(st.dictionaries(st.text(max_size=6), json_values, max_size=2)))
    return json.dumps(cfg).encode()


@examples(80)
@given(data=any_bytes | drafter_configs(), name=st.sampled_from(["drafter_config.json",
                                                                  "config.json"]))
def test_drafter_configs(tmp_path_factory, data, name):
    """``export/eval/doctor --drafter DIR`` (read_drafter) and a training checkpoint's drafter
    (load_drafter): the weights are valid, the config is fuzzed."""
    from specdraft.artifacts.drafter import read_drafter
    from specdraft.artifacts.drafter import load_drafter

    d = tmp_path_factory.mktemp("d")
    (d / name).write_bytes(data)
    weights = {"drafter_config.json": "drafter.safetensors", "config.json": "model.safetensors"}
    (d / weights[name]).write_bytes(b"")  # an empty weights file: refused after the config
    _clear_or_named(lambda: read_drafter(d), d)
    if name == "drafter_config.json":
        _clear_or_named(lambda: load_drafter(d), d)


@examples(80)
@given(data=any_bytes | jsonl_of_values | st.builds(
    lambda v: json.dumps(v).encode(), st.dictionaries(
        st.sampled_from(["stage", "counts", "config", "aux_layer_ids", "hidden_size", "storage",
                         "x"]), json_values, max_size=5)),
       stage=st.sampled_from(["generate", "prepare", "extract", "train", "vocab"]))
def test_stage_manifests(tmp_path_factory, data, stage):
    """A stage's ``manifest.json`` as the next stage reads it (typed per stage)."""
    from specdraft.core.manifest import load_stage_manifest

    d = tmp_path_factory.mktemp("m") / stage
    d.mkdir()
    (d / "manifest.json").write_bytes(data)
    _clear_or_named(lambda: load_stage_manifest(d), d / "manifest.json")


@examples(80)
@given(samples=any_bytes | jsonl_of_values, rejects=any_bytes | jsonl_of_values)
def test_generate_resume_reads_its_files(tmp_path_factory, samples, rejects):
    """``generate --resume`` reads ``samples.jsonl`` and ``rejects.jsonl`` back (a torn tail is
    cut; anything else wrong is a clear error naming file:line)."""
    from specdraft.generate.run import load_prior

    d = tmp_path_factory.mktemp("g")
    (d / "samples.jsonl").write_bytes(samples)
    (d / "rejects.jsonl").write_bytes(rejects)
    try:
        load_prior(d)
    except SpecdraftError as err:
        assert ("samples.jsonl" in str(err) or "rejects.jsonl" in str(err)), err


@examples(60)
@given(data=any_bytes | jsonl_of_values)
def test_chat_format_files(tmp_path_factory, data):
    """``RUN/*/chat_format.json``, read by prepare, extract and eval."""
    from specdraft.core.chat import ChatFormat

    path = tmp_path_factory.mktemp("f") / "chat_format.json"
    path.write_bytes(data)
    _clear_or_named(lambda: ChatFormat.load(path), path)


index_entries = st.fixed_dictionaries({}, optional={
    k: json_values | st.integers(0, 50) | st.just("shards/x.safetensors")
    for k in ("key", "shard", "tok", "seq_len", "sup", "n_sup", "row")})


@examples(40)
@given(data=any_bytes | jsonl_of_values | st.lists(index_entries, min_size=1, max_size=3).map(
    lambda es: b"".join(json.dumps(e).encode() + b"\n" for e in es)))
def test_extract_index(tmp_path_factory, data):
    """``RUN/extract/index.jsonl`` as train and ``extract --verify`` read it."""
    from specdraft.artifacts.hidden_states import read_index

    path = tmp_path_factory.mktemp("x") / "index.jsonl"
    path.write_bytes(data)
    entries = _clear_or_named(lambda: read_index(path), path)
    assert entries is None or all(isinstance(e["key"], str) for e in entries)
