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
