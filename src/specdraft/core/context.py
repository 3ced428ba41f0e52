"""The stage context: who this process is in a (torchrun) job and where it computes. Every
stage's entry is ``run(config, ctx=None, ...)``: ``ctx`` given by the caller (``specdraft run``,
tests), else read from the environment here. The one distributed bootstrap of the stages that run
on several processes (``extract``, ``train``: :func:`stage_context`); the others run in one
process and refuse a multi-process launch (:func:`single_process`).

``torchrun --nproc-per-node N -m specdraft.cli STAGE ...`` sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` (torch.distributed's environment contract); a plain process is rank 0 of 1.
Backend: NCCL when this process computes on CUDA, gloo otherwise (or when asked: the vLLM
extract backend only exchanges small objects between ranks).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # torch is imported when a device is picked: prepare never needs it
    import torch


@dataclass(frozen=True)
class StageContext:
    """rank, world size, local rank and the device of this process (``cuda:LOCAL_RANK`` or
    ``cpu`` when none was asked for)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(requested: str | None, local_rank: int) -> torch.device:
    """``requested`` (``auto``/None: ``cuda:<local_rank>`` when CUDA is available, else CPU)."""
    import torch

    if requested and requested != "auto":
        return torch.device(requested)
    return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")


def single_process(stage: str, ctx: StageContext | None = None,
                   device: str | None = None) -> StageContext:
    """The context of a stage that runs in one process: ``ctx``, else the environment's.

    Raises :class:`~specdraft.core.errors.ConfigError` when it is one of several processes
    (``WORLD_SIZE > 1``): under ``torchrun`` every rank would run the whole stage on the same
    directory. Only ``extract`` and ``train`` shard their work."""
    from specdraft.core.errors import ConfigError

    ctx = ctx or context_from_env(device)
    if ctx.distributed:
        raise ConfigError(f"{stage} runs in one process, but this is rank {ctx.rank} of "
                          f"{ctx.world_size}: run it without torchrun (only extract and train "
                          f"are data-parallel)")
    return ctx


def context_from_env(device: str | None = None) -> StageContext:
    """The context torchrun's environment describes; starts nothing."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return StageContext(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                        local, pick_device(device, local))


@contextmanager
def stage_context(device: str | None = None, *, backend: str | None = None
                  ) -> Iterator[StageContext]:
    """The context of this process, with the process group started when ``WORLD_SIZE > 1`` and
    none exists (``backend``, else NCCL on a CUDA device and gloo elsewhere), and destroyed on
    exit when this call started it (also on an exception)."""
    import torch
    import torch.distributed as dist

    ctx = context_from_env(device)
    created = False
    if ctx.distributed and not dist.is_initialized():
        if ctx.device.type == "cuda":
            torch.cuda.set_device(ctx.device)
        dist.init_process_group(backend or ("nccl" if ctx.device.type == "cuda" else "gloo"))
        created = True
    if ctx.distributed:
        ctx = StageContext(dist.get_rank(), dist.get_world_size(), ctx.local_rank, ctx.device)
    try:
        yield ctx
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()
