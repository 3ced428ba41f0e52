"""torchrun integration, applied from outside the model (the model files never import
``torch.distributed``).

The process group is started by :func:`specdraft.core.context.stage_context` (``torchrun
--nproc-per-node N -m specdraft.cli train ...``; multi-node runs use torchrun's own
``--nnodes/--rdzv-*`` flags). Wrapping: DDP (default) or FSDP2
(``torch.distributed.fsdp.fully_shard``,
one unit around the TTT wrapper: the drafter is a single layer, so per-layer units buy little
and its methods are called outside ``forward``). Checkpoints hold full (unsharded) states
gathered with ``torch.distributed.checkpoint.state_dict``, so they load at any world size.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from specdraft.core.context import StageContext


def wrap(module: nn.Module, env: StageContext, mode: str) -> nn.Module:
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


def all_reduce_sum(t: torch.Tensor, env: StageContext) -> torch.Tensor:
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


def barrier(env: StageContext) -> None:
    if env.distributed:
        dist.barrier()
