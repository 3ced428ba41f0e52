"""The stage context: who this process is in a (torchrun) job and where it computes. The one
distributed bootstrap of every stage that runs on several processes (``extract``, ``train``).

``torchrun --nproc-per-node N -m specdraft.cli STAGE ...`` sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` (torch.distributed's environment contract); a plain process is rank 0 of 1.
Backend: NCCL when this process computes on CUDA, gloo otherwise (or when asked: the vLLM
extract backend only exchanges small objects between ranks).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

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
    if requested and requested != "auto":
        return torch.device(requested)
    return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")


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
