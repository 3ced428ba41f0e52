"""torchrun integration, applied from outside the model (the model files never import
``torch.distributed``).

``torchrun --nproc-per-node N -m specdraft.train ...`` sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK``; multi-node runs use torchrun's own ``--nnodes/--rdzv-*`` flags. Backend: NCCL on
CUDA, gloo on CPU. Wrapping: DDP (default) or FSDP2 (``torch.distributed.fsdp.fully_shard``,
one unit around the TTT wrapper: the drafter is a single layer, so per-layer units buy little
and its methods are called outside ``forward``). Checkpoints hold full (unsharded) states
gathered with ``torch.distributed.checkpoint.state_dict``, so they load at any world size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistEnv:
    """rank, world_size, local_rank and the device of this process."""

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
    """``requested`` or ``cuda:<local_rank>`` when CUDA is available, else CPU."""
    if requested:
        return torch.device(requested)
    return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")


def init_distributed(device: str | None = None) -> DistEnv:
    """Read torchrun's environment; start the process group when ``WORLD_SIZE > 1``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local)
    if world > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return DistEnv(rank, world, local, dev)


def wrap(module: nn.Module, env: DistEnv, mode: str) -> nn.Module:
    """``module`` wrapped for data parallelism (unchanged in a single process)."""
    if not env.distributed:
        return module
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(env.device.type, (env.world_size,))
        return fully_shard(module, mesh=mesh)
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [env.device.index] if env.device.type == "cuda" else None
    return DDP(module, device_ids=ids)


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (FSDP2 shards in place: returned as is)."""
    return module.module if hasattr(module, "module") and isinstance(module.module, nn.Module) \
        else module


def is_fsdp(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def all_reduce_sum(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum ``t`` over ranks (in place, returned); a no-op in a single process."""
    if env.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def full_states(module: nn.Module, optimizer: Any) -> tuple[dict, dict]:
    """(model state, optimizer state), full and on CPU; every rank must call it under FSDP."""
    if not is_fsdp(module):
        return unwrap(module).state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(module, optimizer, options=opts)


def load_full_states(module: nn.Module, optimizer: Any, model_state: dict,
                     optim_state: dict) -> None:
    """Inverse of :func:`full_states` (every rank passes the full states)."""
    if not is_fsdp(module):
        unwrap(module).load_state_dict(model_state)
        optimizer.load_state_dict(optim_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(module, optimizer, model_state_dict=model_state,
                   optim_state_dict=optim_state, options=StateDictOptions(full_state_dict=True))


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def shutdown(env: DistEnv) -> None:
    if env.distributed and dist.is_initialized():
        dist.destroy_process_group()
