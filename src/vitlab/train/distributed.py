"""Everything vitlab knows about running on many processes, in one module.

Launch with torchrun; it sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous variables
(MASTER_ADDR/PORT, or --rdzv-endpoint for many machines):

    torchrun --nproc_per_node 2 -m vitlab train --data digits
    torchrun --nnodes 2 --node_rank 0 --rdzv-endpoint HOST:29500 --nproc_per_node 8 -m vitlab train ...

Data parallel: every process holds the whole model (DistributedDataParallel), sees its part
of each global batch (vitlab.data.loader lays them out), and gradients are averaged. The
FSDP option shards parameters, gradients and optimiser state across processes
(`torch.distributed.fsdp.fully_shard`, one unit per encoder block) for models that do not
fit one device; checkpoints are gathered to full tensors on rank 0. Backends: NCCL on GPUs,
gloo on CPUs. Only rank 0 writes files.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from vitlab.config import ConfigError, pick_device


@dataclass
class Context:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    parallel: str = "none"  # none, ddp, fsdp

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


def setup(device: str = "auto", parallel: str = "ddp") -> Context:
    """Join the process group when started by torchrun; pick the device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, "train.device=")
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank if dev.index is None else dev.index)
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", device_id=dev if dev.type == "cuda" else None)
    return Context(rank, world, local_rank, dev, parallel if world > 1 else "none")


def cleanup(ctx: Context) -> None:
    if ctx.active and dist.is_initialized():
        dist.destroy_process_group()


def wrap(module: nn.Module, ctx: Context, inner: nn.Module | None = None) -> nn.Module:
    """The module the training step calls: DDP or FSDP around the objective, or itself.

    FSDP units: each encoder block of the backbone `inner`, the backbone itself (so that
    calling it directly, as evaluation does, gathers its weights) and the objective."""
    if ctx.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return DDP(module, device_ids=ids)
    if ctx.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in getattr(inner, "blocks", []):
            fully_shard(block)
        if inner is not None:
            fully_shard(inner)
        fully_shard(module)
        return module
    return module


@contextlib.contextmanager
def no_sync(wrapped: nn.Module, skip: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on all but the last micro-batch of an accumulated step."""
    if skip and hasattr(wrapped, "no_sync"):
        with wrapped.no_sync():
            yield
    elif skip and hasattr(wrapped, "set_requires_gradient_sync"):  # FSDP2
        wrapped.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)
    else:
        yield


def sum_tensors(values: dict[str, torch.Tensor], ctx: Context) -> dict[str, torch.Tensor]:
    """Add each tensor across processes (in place, returned for convenience)."""
    if ctx.active:
        for v in values.values():
            dist.all_reduce(v, op=dist.ReduceOp.SUM)
    return values


def any_flag(flag: bool, ctx: Context) -> bool:
    """True on every process if it is true on any (e.g. a NaN loss on one of them)."""
    if not ctx.active:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def gather_objects(obj: Any, ctx: Context) -> list[Any]:
    """Every process's `obj`, in rank order (on every process)."""
    if not ctx.active:
        return [obj]
    out: list[Any] = [None] * ctx.world
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, ctx: Context) -> Any:
    if not ctx.active:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(ctx: Context) -> None:
    if ctx.active:
        dist.barrier()


def full_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole tensors on the CPU: FSDP shards (DTensors) are gathered, which every process
    must call together; plain tensors are copied as they are."""
    out = {}
    for k, t in state.items():
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        out[k] = t.detach().cpu().contiguous()
    return out


def is_main_process() -> bool:
    """Rank 0 of a torchrun launch (or a plain process): the one that writes files."""
    return int(os.environ.get("RANK", "0")) == 0


def full_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer, ctx: Context) -> dict:
    if ctx.parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(module, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return optimizer.state_dict()


def load_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer, state: dict, ctx: Context) -> None:
    if ctx.parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(module, optimizer, state, options=StateDictOptions(full_state_dict=True))
        return
    optimizer.load_state_dict(state)


def check_precision(precision: str, ctx: Context, fp16_devices: tuple[str, ...]) -> None:
    """train.precision=fp16 where it runs: a device with fast fp16 and a plain (non-FSDP) scaler."""
    if precision != "fp16":
        return
    if ctx.device.type not in fp16_devices:
        raise ConfigError(
            f"train.precision=fp16 needs a CUDA GPU (fp16 autocast with a loss scaler); this run is on "
            f"{ctx.device.type}, which has no fast fp16: use train.precision=bf16 (--bf16), same speed-up "
            "where supported and no scaler needed"
        )
    if ctx.parallel == "fsdp":
        raise ConfigError("train.precision=fp16 is not supported with FSDP (its scaler is sharded); use bf16")
