"""``extract --endpoint``: rows spread over servers, each captured once, a dead server's rows
taken by the others, resume, and the identity checks before any row; against fake servers
(:mod:`live_fakes`: the transformers verifier answering as vLLM's server with specdraft's
connector). The real server: ``tests/engine/test_live_capture.py``.

Tolerance against the transformers backend: both compute in float32 and store bf16, the fake
one row at a time and the backend in padded batches, so a stored value may differ by one bf16
step: ``|a - b| <= 2^-7·|b| + 1e-5·max|b|`` per row and layer id.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdraft.core.errors import ConfigError
from specdraft.engines.process import EngineError
from specdraft.extract.config import ExtractConfig
from specdraft.extract.endpoint import base_url, connect
from specdraft.extract.run import run
from specdraft.artifacts.hidden_states import DiskSource

from extract_helpers import random_rows, write_prepared
from live_fakes import FakeServer, install
from vllm_helpers import compare_sources

AUX = (1, 2, 3)
CAPTURE = [1, 2, 3, 4]  # the aux ids and N = 4 (pre-norm)
N_ROWS = 10
A, B = "http://fake-a:8000", "http://fake-b:8000"


@pytest.fixture(scope="module")
def rows():
    ids, masks = random_rows([12 + 3 * i for i in range(N_ROWS)], vocab=2000, seed=3)
    masks[2] = [0] * len(masks[2])  # a row without targets
    return ids, masks


def _kw(verifier: Path, **extra):
    return {**dict(verifier=str(verifier), aux_layers=AUX, storage="bf16", batch_tokens=60,
                   shard_mb=0.02, dtype="auto", device="cpu"), **extra}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_verifier_dir, rows):
    """The transformers backend on the same rows."""
    run_dir = write_prepared(tmp_path_factory.mktemp("ref") / "run", *rows)
    run(ExtractConfig(run_dir=run_dir, **{**_kw(tiny_verifier_dir), "dtype": "float32"}))
    return run_dir / "extract"


def _live(tmp_path, monkeypatch, verifier, rows, servers, name="run", **extra):
    run_dir = tmp_path / name
    if not (run_dir / "prepare").exists():
        write_prepared(run_dir, *rows)
    install(monkeypatch, servers)
    run(ExtractConfig(run_dir=run_dir, endpoint=list(servers), **_kw(verifier, **extra)))
    return run_dir / "extract"


def _captured(fake: FakeServer) -> list[int]:
    """The rows a fake captured after its probe (the probe is its first request)."""
    return fake.rows[1:]


def _same_artifacts(a: Path, b: Path) -> None:
    assert (a / "index.jsonl").read_text() == (b / "index.jsonl").read_text()
    names = sorted(p.name for p in (a / "shards").iterdir())
    assert names == sorted(p.name for p in (b / "shards").iterdir()) and names
    for n in names:
        assert (a / "shards" / n).read_bytes() == (b / "shards" / n).read_bytes(), n


def test_two_servers_each_row_once_equal_to_transformers(tmp_path, monkeypatch, tiny_model,
                                                         tiny_verifier_dir, rows, reference):
    fakes = {u: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir)) for u in (A, B)}
    out = _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, fakes,
                endpoint_concurrency=2)
    got = _captured(fakes[A]) + _captured(fakes[B])
    assert sorted(got) == list(range(N_ROWS))  # every row once, over both servers
    assert _captured(fakes[A]) and _captured(fakes[B])
    ratios = compare_sources(DiskSource(out), DiskSource(reference), AUX, 64, rel=2**-7,
                             floor=1e-5)
    assert len(ratios) == N_ROWS * 4 and max(ratios.values()) <= 1.0, ratios
    assert (out / "index.jsonl").read_text() == (reference / "index.jsonl").read_text()
    m = json.loads((out / "manifest.json").read_text())
    assert m["verifier"]["backend"] == "endpoint"
    assert m["verifier"]["final_state"].startswith("post_norm (applied by specdraft")
    servers = m["verifier"]["endpoint"]["servers"]
    assert {u: s["root_check"] for u, s in servers.items()} == {A: "same path", B: "same path"}
    assert {u: s["capture_ids"] for u, s in servers.items()} == {A: CAPTURE, B: CAPTURE}
    counts = m["throughput"][0]["servers"]
    assert counts[A]["rows"] + counts[B]["rows"] == N_ROWS
    assert not list((out / "live").iterdir())  # every capture file taken and deleted


def test_dead_server_rows_go_to_the_other(tmp_path, monkeypatch, tiny_model, tiny_verifier_dir,
                                          rows):
    """A dies after its probe and 2 rows: its other rows go to B, none lost or twice; the
    artifacts are byte-identical to one healthy server's."""
    one = {A: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir))}
    healthy = _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, one, name="one")
    fakes = {A: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir), die_after=3),
             B: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir))}
    out = _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, fakes, name="dead")
    a, b = _captured(fakes[A]), _captured(fakes[B])
    assert len(a) == 2 and not set(a) & set(b) and sorted(a + b) == list(range(N_ROWS))
    _same_artifacts(healthy, out)
    m = json.loads((out / "manifest.json").read_text())
    assert m["throughput"][0]["servers"][A]["failures"]  # said, with its cause


def test_resume_after_every_server_died_gives_identical_artifacts(tmp_path, monkeypatch,
                                                                  tiny_model, tiny_verifier_dir,
                                                                  rows):
    one = {A: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir))}
    whole = _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, one, name="whole")
    dying = {A: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir), die_after=6)}
    with pytest.raises(EngineError, match="no server has answered for 1 s"):
        _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, dying, name="cut",
              endpoint_timeout_s=1.0, endpoint_concurrency=1)
    kept = list((tmp_path / "cut" / "extract" / "shards").iterdir())
    assert kept  # some shards were complete before the server died
    back = {A: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir))}
    out = _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, back, name="cut", resume=True)
    assert 0 < len(_captured(back[A])) < N_ROWS  # the finished shards' rows were not redone
    _same_artifacts(whole, out)


def test_resume_through_another_verifier_is_refused(tmp_path, monkeypatch, tiny_model,
                                                     tiny_verifier_dir, rows):
    """One server whose states are the verifier's × 1.5 (its normed final state and so its
    answer are the same, so only the stored rows can tell): the resume probe re-captures a
    stored row and refuses before any new row."""
    dying = {A: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir), die_after=6)}
    with pytest.raises(EngineError):
        _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, dying, endpoint_timeout_s=1.0,
              endpoint_concurrency=1)
    other = {A: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir), scale=1.5)}
    with pytest.raises(ConfigError, match=r"stored row s\d+/0 captured now differs"):
        _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, other, resume=True)
    assert other[A].completions == 1  # the probe only


def test_a_server_that_comes_back_takes_rows_again(tmp_path, monkeypatch, tiny_model,
                                                   tiny_verifier_dir, rows):
    """The only server goes down, comes back within --endpoint-timeout-s: the run finishes."""
    import threading

    fake = FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir), die_after=4)
    timer = threading.Timer(1.0, fake.revive)
    timer.start()
    try:
        out = _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, {A: fake},
                    endpoint_timeout_s=30.0)
    finally:
        timer.cancel()
    assert sorted(_captured(fake)) == list(range(N_ROWS))
    assert json.loads((out / "manifest.json").read_text())["counts"]["rows_out"] == N_ROWS


@pytest.mark.parametrize("fault, match, completions", [
    ({"announce_ids": [1, 2, 4]}, r"captures vLLM layer ids \[1, 2, 4\], this run needs", 0),
    ({"head_shift": 1}, "another head or final norm", 1),
    ({"capture": False}, "does not capture hidden states to the path asked", 1),
])
def test_identity_refused_before_any_row(tmp_path, monkeypatch, tiny_model, tiny_verifier_dir,
                                         rows, fault, match, completions):
    fake = FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir), **fault)
    with pytest.raises(ConfigError, match=match):
        _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, {A: fake})
    assert fake.completions == completions  # nothing but the probe
    assert not list((tmp_path / "run" / "extract" / "shards").glob("*.safetensors"))


def test_another_model_path_refused(tmp_path, monkeypatch, tiny_model, tiny_verifier_dir, rows,
                                    smollm2_tokenizer_dir):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "top_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
    top = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(top)
    other = top.make_tiny_verifier(tmp_path / "other", smollm2_tokenizer_dir, seed=1)
    fake = FakeServer(tiny_model, CAPTURE, str(other))
    with pytest.raises(ConfigError, match="not the run's verifier"):
        _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, {A: fake})
    assert fake.completions == 0


def test_servers_that_disagree_are_refused(tmp_path, monkeypatch, tiny_model, tiny_verifier_dir,
                                           rows):
    """B's states are A's × 1.5 (its head still answers the same token): the probe compares
    the servers with each other."""
    fakes = {A: FakeServer(tiny_model, CAPTURE, ""),
             B: FakeServer(tiny_model, CAPTURE, "", scale=1.5)}
    with pytest.raises(ConfigError, match="do not serve the same verifier"):
        _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, fakes)


def test_dtype_other_than_the_servers_refused(tmp_path, monkeypatch, tiny_model,
                                              tiny_verifier_dir, rows):
    fake = FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir))
    with pytest.raises(ConfigError, match="--dtype bfloat16: the --endpoint servers run float32"):
        _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, {A: fake}, dtype="bfloat16")


def test_unreachable_server_and_bad_flags(tmp_path, monkeypatch, tiny_model, tiny_verifier_dir,
                                          rows):
    fake = FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir), die_after=0)
    with pytest.raises(EngineError, match="cannot reach http://fake-a:8000"):
        _live(tmp_path, monkeypatch, tiny_verifier_dir, rows, {A: fake})
    with pytest.raises(ConfigError, match="named twice"):
        connect([A, A + "/v1/"], 1.0)
    assert base_url("http://h:1/v1/") == base_url("http://h:1") == "http://h:1"
    with pytest.raises(ValueError, match="--backend vllm starts an engine"):
        ExtractConfig(run_dir=tmp_path, backend="vllm", endpoint=[A])
    with pytest.raises(ValueError, match="not an http"):
        ExtractConfig(run_dir=tmp_path, endpoint=["fake-a:8000"])
