"""``train --online --endpoint``: rows captured through (fake) servers ahead of each step train
exactly as ``extract --endpoint`` followed by offline ``train`` on the same rows and seed.

Tolerance: none. The fake (:mod:`live_fakes`) computes each row alone in fp32 on both paths,
both round through the same bf16 codec and decode the same way, so the rows, and so the losses
and weights, are bit-identical; the test asserts equality.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft.extract.config import ExtractConfig
from specdraft.extract.live_source import LiveSource, open_live_source
from specdraft.extract.run import run as extract
from specdraft.train.config import TrainConfig
from specdraft.train.run import run as train

from extract_helpers import random_rows, write_prepared
from live_fakes import FakeServer, install

AUX = (1, 2, 3)
CAPTURE = [1, 2, 3, 4]
A, B = "http://fake-a:8000", "http://fake-b:8000"
N_ROWS = 14


@pytest.fixture(scope="module")
def rows():
    return random_rows([9 + 2 * i for i in range(N_ROWS)], vocab=2000, seed=5)


def _prepare(run_dir: Path, rows, verifier_dir: Path) -> Path:
    from stubs import write_stub_manifest

    write_prepared(run_dir, *rows)
    V = json.loads((verifier_dir / "config.json").read_text())["vocab_size"]
    draft = torch.arange(V)  # every verifier token: its argmax on random rows is supervised
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft] = True
    (run_dir / "vocab").mkdir()
    save_file({"d2t": draft - torch.arange(len(draft)), "t2d": t2d},
              str(run_dir / "vocab" / "vocab_map.safetensors"))
    write_stub_manifest(run_dir / "vocab", "vocab")
    return run_dir


def _cfg(run_dir: Path, verifier_dir: Path, **kw) -> TrainConfig:
    values = dict(run_dir=run_dir, epochs=3, max_steps=6, ttt_steps=2, lr=3e-3, warmup_steps=2,
                  batch_tokens=60, grad_accum=2, val_fraction=0.2, eval_every=3, save_every=3,
                  log_every=1, seed=7, teacher_check=False, report_to="none", device="cpu",
                  dtype="float32", verifier=str(verifier_dir))
    values.update(kw)
    return TrainConfig(**values)


def _curve(run_dir: Path) -> list[tuple[str, int, float]]:
    lines = (run_dir / "train" / "metrics.jsonl").read_text().splitlines()
    return [(r["split"], r["step"], r["loss"]) for r in map(json.loads, lines) if "loss" in r]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "train" / "last" / "drafter.safetensors"))


@pytest.fixture(scope="module")
def offline(tmp_path_factory, tiny_model, tiny_verifier_dir, rows):
    """extract --endpoint (bf16) then offline train: the reference curve and weights."""
    mp = pytest.MonkeyPatch()
    try:
        install(mp, {A: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir))})
        run_dir = _prepare(tmp_path_factory.mktemp("offline") / "run", rows, tiny_verifier_dir)
        extract(ExtractConfig(run_dir=run_dir, endpoint=[A], verifier=str(tiny_verifier_dir),
                              aux_layers=AUX, storage="bf16", dtype="auto", device="cpu"))
    finally:
        mp.undo()
    train(_cfg(run_dir, tiny_verifier_dir))
    return _curve(run_dir), _weights(run_dir)


def _live(tmp_path, monkeypatch, model, verifier_dir, rows, fakes, opened=None, **kw):
    install(monkeypatch, fakes)
    run_dir = _prepare(tmp_path / "live", rows, verifier_dir)
    opened = [] if opened is None else opened

    def factory(cfg, env):
        opened.append(open_live_source(cfg, env))
        return opened[-1]

    m = train(_cfg(run_dir, verifier_dir, online=True, endpoint=list(fakes), aux_layers=AUX,
                   online_storage="bf16", endpoint_concurrency=2, **kw), source=factory)
    return run_dir, m


def test_live_training_equals_extract_then_train(tmp_path, monkeypatch, tiny_model,
                                                 tiny_verifier_dir, rows, offline):
    fakes = {u: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir)) for u in (A, B)}
    opened: list = []
    run_dir, m = _live(tmp_path, monkeypatch, tiny_model, tiny_verifier_dir, rows, fakes,
                       opened, online_prefetch=3)
    curve, weights = offline
    assert len([c for c in curve if c[0] == "train"]) == 6 and any(c[0] == "val" for c in curve)
    assert all(c[2] > 1.0 for c in curve)  # every step and validation has supervised positions
    assert _curve(run_dir) == curve  # every train and val loss, bit-equal
    got = _weights(run_dir)
    assert all(torch.equal(got[k], weights[k]) for k in weights)
    assert m["inputs"].keys() >= {"vocab", "prepare"} and "extract" not in m["inputs"]
    assert m["teacher_check"]["status"] == "skipped"
    # the training rows came from the prefetch (6 steps x 2 micro-batches), validation's on
    # demand (2 validations over the val rows)
    served = opened[0].served
    n_val = m["counts"]["rows_val"]
    assert served["on_demand"] == 2 * n_val and served["prefetched"] > 0
    assert served["prefetched"] == len(fakes[A].rows[1:] + fakes[B].rows[1:]) - 2 * n_val
    # both servers served rows; nothing left on disk but the (empty) capture directory
    assert fakes[A].rows[1:] and fakes[B].rows[1:]
    assert not list((run_dir / "train" / "live" / "rank00000").iterdir())
    assert not (run_dir / "extract").exists()


def test_resume_equals_uninterrupted(tmp_path, monkeypatch, tiny_model, tiny_verifier_dir,
                                     rows, offline):
    """Killed after step 4 (checkpoint at 3), resumed: the step counter decides the rows."""
    from specdraft.train import loop

    fakes = {A: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir))}
    real = loop.Trainer.train_step

    def crash(self, window):
        if self.step == 4:
            raise KeyboardInterrupt
        return real(self, window)

    monkeypatch.setattr(loop.Trainer, "train_step", crash)
    with pytest.raises(KeyboardInterrupt):
        _live(tmp_path, monkeypatch, tiny_model, tiny_verifier_dir, rows, fakes)
    monkeypatch.setattr(loop.Trainer, "train_step", real)
    run_dir = tmp_path / "live"
    m = train(_cfg(run_dir, tiny_verifier_dir, online=True, endpoint=[A], aux_layers=AUX,
                   resume=True), source=open_live_source)
    assert m["resumed"]
    curve, weights = offline
    got = _weights(run_dir)
    assert all(torch.equal(got[k], weights[k]) for k in weights)
    assert [c for c in _curve(run_dir) if c[1] > 3] == [c for c in curve if c[1] > 3]


def test_prefetch_that_skips_a_row_is_caught(tmp_path, monkeypatch, tiny_model,
                                             tiny_verifier_dir, rows, offline):
    real = LiveSource.capture

    def skipping(self, indices):
        got = real(self, indices)
        if threading.current_thread().name == "live-prefetch":
            got.pop(list(indices)[-1])
        return got

    monkeypatch.setattr(LiveSource, "capture", skipping)
    fakes = {A: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir))}
    with pytest.raises(RuntimeError, match=r"prefetch chunk 0 holds rows .* the plan asked"):
        _live(tmp_path, monkeypatch, tiny_model, tiny_verifier_dir, rows, fakes)


def test_rows_in_another_order_change_the_curve(tmp_path, monkeypatch, tiny_model,
                                                tiny_verifier_dir, rows, offline):
    """The planted fault: the prefetch hands each chunk's rows shifted by one. The comparison
    the equality test makes sees it."""
    real = LiveSource.capture

    def shifted(self, indices):
        got = real(self, indices)
        if threading.current_thread().name != "live-prefetch":
            return got
        order = list(indices)
        return {i: got[order[(k + 1) % len(order)]] for k, i in enumerate(order)}

    monkeypatch.setattr(LiveSource, "capture", shifted)
    fakes = {A: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir))}
    run_dir, _ = _live(tmp_path, monkeypatch, tiny_model, tiny_verifier_dir, rows, fakes,
                       online_prefetch=4)
    assert _curve(run_dir) != offline[0]


def test_endpoint_needs_online(tmp_path, tiny_verifier_dir):
    with pytest.raises(ValueError, match="--endpoint trains from running servers: add --online"):
        TrainConfig(run_dir=tmp_path, endpoint=[A])
    with pytest.raises(ValueError, match="not an http"):
        TrainConfig(run_dir=tmp_path, online=True, verifier=str(tiny_verifier_dir),
                    endpoint=["fake-a:8000"])


def test_the_command_line_trains_from_the_servers(tmp_path, monkeypatch, tiny_model,
                                                  tiny_verifier_dir, rows, offline):
    """``specdraft train --online --endpoint``: the CLI hands the live source to the stage."""
    from typer.testing import CliRunner

    from specdraft.cli import app

    install(monkeypatch, {A: FakeServer(tiny_model, CAPTURE, str(tiny_verifier_dir))})
    run_dir = _prepare(tmp_path / "cli", rows, tiny_verifier_dir)
    flags = {k: v for k, v in _cfg(run_dir, tiny_verifier_dir).to_dict().items()
             if k in ("epochs", "max_steps", "ttt_steps", "lr", "warmup_steps", "batch_tokens",
                      "grad_accum", "val_fraction", "eval_every", "save_every", "log_every",
                      "seed", "report_to", "device", "dtype", "verifier")}
    argv = ["train", "--run-dir", str(run_dir), "--online", "--endpoint", A,
            "--aux-layers", "1,2,3", "--no-teacher-check", "--online-prefetch", "5"]
    for k, v in flags.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, (res.output, res.exception)
    assert _curve(run_dir) == offline[0]


@pytest.mark.slow
def test_two_process_ddp_each_rank_its_own_rows(tmp_path, tiny_verifier_dir, rows):
    """torchrun --nproc-per-node 2 (grad_accum 1) == 1 process (grad_accum 2): the same weights,
    each rank prefetching only its own rows (disjoint, together the one process's rows)."""
    import collections
    import os
    import subprocess
    import sys

    here = Path(__file__).parent
    path = os.pathsep.join(p for p in (str(here), str(here.parent),
                                       os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    worker = str(here / "live_ddp_worker.py")
    one = _prepare(tmp_path / "one", rows, tiny_verifier_dir)
    two = _prepare(tmp_path / "two", rows, tiny_verifier_dir)
    subprocess.run([sys.executable, worker, str(one), "2", str(tiny_verifier_dir),
                    str(tmp_path / "one.json")], check=True, env=env, timeout=600)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--master-port", str(port), worker, str(two), "1", str(tiny_verifier_dir),
                    str(tmp_path / "two.json")], check=True, env=env, timeout=600)
    w1, w2 = _weights(one), _weights(two)
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=1e-4, atol=1e-6)
    solo = json.loads((tmp_path / "one.json.rank0").read_text())
    ranks = [json.loads((tmp_path / f"two.json.rank{r}").read_text()) for r in (0, 1)]
    assert len(ranks[0]["orders"]) == len(ranks[1]["orders"]) == len(solo["orders"]) > 1
    for e, whole in enumerate(solo["orders"]):  # per epoch: the one process's rows, split
        mine, theirs = ranks[0]["orders"][e], ranks[1]["orders"][e]
        assert mine and theirs and not set(mine) & set(theirs)
        assert sorted(mine + theirs) == sorted(whole)
    for rank in ranks:  # each rank's rows captured by its own requests (+ validation's)
        wanted = collections.Counter(i for o in rank["orders"] for i in o)
        assert not wanted - collections.Counter(rank["captured"])
