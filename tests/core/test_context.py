"""The stage context (:mod:`specdraft.core.context`): the one place a stage learns its rank and
device, and the one distributed bootstrap."""

import re
from pathlib import Path

import torch

from specdraft.core.context import context_from_env, pick_device, stage_context

SRC = Path(__file__).resolve().parents[2] / "src" / "specdraft"


def test_context_reads_torchrun_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    ctx = context_from_env("cpu")
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.device) == \
        (3, 8, 1, torch.device("cpu"))
    assert ctx.distributed and not ctx.is_main


def test_a_plain_process_is_rank_0_of_1_and_starts_no_group(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with stage_context("auto") as ctx:
        assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.distributed) == (0, 1, True, False)
        assert not torch.distributed.is_initialized()
    assert ctx.device == pick_device(None, 0)
    assert pick_device("cuda:2", 0) == torch.device("cuda:2")


def test_one_distributed_bootstrap():
    """``init_process_group`` and torchrun's variables are read in core/context.py only."""
    found = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
             if re.search(r"init_process_group\(|environ\.get\(\"(RANK|WORLD_SIZE|LOCAL_RANK)\"",
                          p.read_text())}
    assert found <= {"core/context.py", "cli/train.py"}, found


def test_every_stage_entry_takes_its_context_second():
    """``run(config, ctx=None, ...)`` for every stage the pipeline runs and for doctor; the
    pipeline hands each the context it built (one process)."""
    import inspect

    from specdraft.pipeline.stages import STAGES

    entries = {s.name: s.load_entry() for s in STAGES}
    from specdraft.doctor.run import run as doctor

    entries["doctor"] = doctor
    for name, entry in entries.items():
        params = list(inspect.signature(entry).parameters.values())
        assert [p.name for p in params[:2]] == ["config", "ctx"], name
        assert params[1].default is None, name
        assert all(p.kind is p.KEYWORD_ONLY for p in params[2:]), name


def test_single_process_stages_refuse_a_torchrun_launch(monkeypatch, tmp_path):
    """Under ``torchrun`` every rank of prepare (or vocab, export, eval, doctor, generate,
    ``specdraft run``) would run the whole stage on one directory: refused, naming the rank;
    a caller's one-process context is used as given."""
    import pytest

    from specdraft.core.context import StageContext, single_process
    from specdraft.core.errors import ConfigError
    from specdraft.prepare.config import PrepareConfig
    from specdraft.prepare.run import run as prepare

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ConfigError, match=r"prepare runs in one process, but this is rank 1 "
                                          r"of 2: run it without torchrun"):
        prepare(PrepareConfig(run_dir=str(tmp_path / "run"), data=str(tmp_path / "x.jsonl")))
    assert not (tmp_path / "run").exists()
    mine = StageContext(0, 1, 0, torch.device("cpu"))
    assert single_process("prepare", mine) is mine
