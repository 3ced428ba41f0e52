"""A train resume cannot drift: changed settings are refused naming each field, the allowed ones
(save/log/eval cadence) are applied and recorded, and a checkpoint lacking a piece of state is
refused naming it."""

import json

import pytest
import torch

from specdraft.core.errors import StageDirError
from specdraft.core.resume import MAY_CHANGE
from specdraft.train import checkpoint as ckpt
from specdraft.train.config import TrainConfig
from specdraft.train.run import run

BASE = dict(epochs=1000, ttt_steps=2, lr=3e-3, warmup_steps=2, batch_tokens=36 * 4,
            val_fraction=0.2, eval_every=2, save_every=2, log_every=1, max_steps=4,
            teacher_check=False)


def cfg(run_dir, **kw) -> TrainConfig:
    return TrainConfig(run_dir=run_dir, **{**BASE, **kw})


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus, verifier, source):
    """A finished 4-step run (checkpoints at steps 2 and 4), copied by each test."""
    from memsource import write_vocab

    d = tmp_path_factory.mktemp("trained")
    write_vocab(d, corpus, 1024)
    run(cfg(d), verifier=verifier, source=source)
    return d


@pytest.fixture
def run_dir(trained, tmp_path):
    import shutil

    shutil.copytree(trained, tmp_path / "r")
    return tmp_path / "r"


@pytest.mark.parametrize("changed, message", [
    ({"lr": 2e-3}, "--lr 0.003 → 0.002"),
    ({"epochs": 3}, "--epochs 1000 → 3"),
    ({"lr": 2e-3, "ttt_steps": 3}, "--lr 0.003 → 0.002; --ttt-steps 2 → 3"),
    ({"max_steps": 6}, "--max-steps 4 → 6"),
])
def test_changed_setting_refused_naming_each_field(run_dir, verifier, source, changed, message):
    before = (run_dir / "train" / "checkpoints" / "step-4" / ckpt.STATE_FILE).read_bytes()
    with pytest.raises(StageDirError) as err:
        run(cfg(run_dir, resume=True, **changed), verifier=verifier, source=source)
    text = str(err.value)
    assert message in text and "--overwrite" in text and "--run-dir" in text
    assert "step-4" in text and "\n" not in text
    # nothing was trained nor rewritten
    assert (run_dir / "train" / "checkpoints" / "step-4" / ckpt.STATE_FILE).read_bytes() == before
    assert not (run_dir / "train" / "manifest.json").exists()


def test_allowed_changes_applied_and_recorded(run_dir, verifier, source):
    m = run(cfg(run_dir, resume=True, save_every=3, log_every=2, max_steps=4),
            verifier=verifier, source=source)
    assert m["resumed"] and m["steps"] == 4
    manifest = json.loads((run_dir / "train" / "manifest.json").read_text())
    assert manifest["resume_changes"] == {"save_every": [2, 3], "log_every": [1, 2]}
    assert manifest["config"]["save_every"] == 3
    state = torch.load(run_dir / "train" / "checkpoints" / "step-4" / ckpt.STATE_FILE,
                       weights_only=False)
    assert state["config"]["save_every"] == 2  # the checkpoint keeps the settings that made it
    assert {"save_every", "log_every", "eval_every"} <= MAY_CHANGE["train"]
    assert not {"lr", "epochs", "max_steps", "seed", "dtype", "attn_impl"} & MAY_CHANGE["train"]


def test_same_settings_resume_is_accepted(run_dir, verifier, source):
    m = run(cfg(run_dir, resume=True), verifier=verifier, source=source)
    assert m["resumed"] and m["resume_changes"] == {}


def test_changed_process_count_refused(run_dir, verifier, source):
    path = run_dir / "train" / "checkpoints" / "step-4" / ckpt.STATE_FILE
    state = torch.load(path, weights_only=False)
    torch.save({**state, "world_size": 2}, path)
    with pytest.raises(StageDirError, match="with 1 processes but .* written by 2"):
        run(cfg(run_dir, resume=True), verifier=verifier, source=source)


def test_old_checkpoint_without_settings_compares_the_hash(run_dir, verifier, source):
    for step in (2, 4):
        path = run_dir / "train" / "checkpoints" / f"step-{step}" / ckpt.STATE_FILE
        state = torch.load(path, weights_only=False)
        del state["config"]
        torch.save(state, path)
    with pytest.raises(StageDirError, match="hash .* differs"):
        run(cfg(run_dir, resume=True, lr=2e-3), verifier=verifier, source=source)
    assert run(cfg(run_dir, resume=True), verifier=verifier, source=source)["resumed"]


PIECES = [*ckpt.STATE_KEYS, "optimizer.state", "optimizer.param_groups", "scheduler.last_epoch",
          "rng.python", "rng.torch"]


@pytest.mark.parametrize("piece", PIECES)
def test_checkpoint_missing_a_piece_refused_naming_it(run_dir, verifier, source, piece):
    for step in (2, 4):  # every checkpoint lacks it: nothing to fall back to
        path = run_dir / "train" / "checkpoints" / f"step-{step}" / ckpt.STATE_FILE
        state = torch.load(path, weights_only=False)
        key, _, sub = piece.partition(".")
        del (state[key] if sub else state)[sub or key]
        torch.save(state, path)
    with pytest.raises(StageDirError) as err:
        run(cfg(run_dir, resume=True), verifier=verifier, source=source)
    text = str(err.value)
    assert f"step-4: {ckpt.STATE_FILE} lacks {piece}" in text
    assert f"step-2: {ckpt.STATE_FILE} lacks {piece}" in text and "--overwrite" in text


@pytest.mark.parametrize("name", ["drafter.safetensors", "drafter_config.json", ckpt.STATE_FILE])
def test_checkpoint_missing_a_file_refused_naming_it(run_dir, verifier, source, name):
    for step in (2, 4):
        (run_dir / "train" / "checkpoints" / f"step-{step}" / name).unlink()
    with pytest.raises(StageDirError, match=f"step-4: unreadable .*{name}.*step-2"):
        run(cfg(run_dir, resume=True), verifier=verifier, source=source)


def test_newest_checkpoint_incomplete_falls_back_to_the_older(run_dir, verifier, source, capsys):
    path = run_dir / "train" / "checkpoints" / "step-4" / ckpt.STATE_FILE
    state = torch.load(path, weights_only=False)
    del state["scheduler"]
    torch.save(state, path)
    m = run(cfg(run_dir, resume=True), verifier=verifier, source=source)
    assert m["resumed"] and m["steps"] == 4
    assert "skipping checkpoint step-4: train_state.pt lacks scheduler" in capsys.readouterr().out


def test_cli_refusal_is_one_error_line(run_dir, verifier, source, capsys, monkeypatch):
    """Through the CLI's error handler: one ``specdraft: error:`` line, exit 2."""
    import specdraft.train.run as train_run
    from specdraft.cli import main

    real = train_run.run
    monkeypatch.setattr(train_run, "run",
                        lambda config, **kw: real(config, verifier=verifier, source=source))
    argv = ["train", "--run-dir", str(run_dir), "--resume", "--lr", "0.002"]
    argv += [x for k, v in BASE.items() if k not in ("teacher_check", "lr")
             for x in (f"--{k.replace('_', '-')}", str(v))] + ["--no-teacher-check"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert err[0].startswith("specdraft: error: --resume with changed settings: --lr 0.003 → "
                             "0.002")
