"""Everything vitlab knows about running on many processes, in one module.

Launch with torchrun; it sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous variables
(MASTER_ADDR/PORT, or --rdzv-endpoint for many machines):

    torchrun --nproc_per_node 2 -m vitlab train --data digits
    torchrun --nnodes 2 --node_rank 0 --rdzv-endpoint HOST:29500 --nproc_per_node 8 -m vitlab train ...

or with Slurm's srun, one task per process: `srun -n 8 vitlab train ...` (in an sbatch job, or
interactively). The tasks of one job step form one process group from Slurm's variables
(SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID), meeting on the first node of the step's
node list (MASTER_ADDR and MASTER_PORT, when set, say where instead). torchrun's variables
win where both are set (`srun torchrun ...`, one torchrun per node); a job's batch script
itself, outside any step, is one process however many tasks the job has.

Data parallel: every process holds the whole model (DistributedDataParallel), sees its part
of each global batch (vitlab.data.loader lays them out), and gradients are averaged. The
FSDP option shards parameters, gradients and optimiser state across processes
(`torch.distributed.fsdp.fully_shard`, one unit per encoder block) for models that do not
fit one device; checkpoints are gathered to full tensors on rank 0. Backends: NCCL on GPUs,
gloo on CPUs. Only rank 0 writes files.

Leaving cleanly (gloo). A gloo process group runs its collectives on worker threads, which
drop their hold on a collective's tensors a moment after the caller has its result. A
thread that drops the last hold on a tensor Python has already let go of needs Python's
lock, and if the interpreter is finalising by then, the process aborts ("terminate called
without an active exception"). So every collective here keeps its tensors until the
backend has let go of them (`_collective`), the group is created after torch._dynamo is
imported (imported later, as DDP's constructor does, it keeps a hold on the group that
destroy_process_group cannot clear), and `cleanup` destroys the group once the run's modules
are gone, which joins its threads.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import os
import pickle
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.distributed as dist
from torch import nn

from vitlab.config import ConfigError, pick_device
from vitlab.config.fields import is_digits

# Where the processes of a Slurm job step meet when MASTER_PORT does not say: a port of this
# range chosen from the job and step ids, so that two jobs sharing a node do not collide.
SLURM_PORTS = (20000, 40000)


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


@dataclass(frozen=True)
class Launch:
    """This process's place among the processes of a run, and how they meet (`init`: an
    init_method URL, "" for torchrun's env://)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    init: str = ""


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: "gpu[07-09,12],cpu3" -> "gpu07" (what `scontrol
    show hostnames` lists first)."""
    out, i = "", 0
    while i < len(nodelist) and nodelist[i] != ",":
        if nodelist[i] == "[":
            end = nodelist.index("]", i)
            out += re.split(r"[,-]", nodelist[i + 1 : end])[0]
            i = end + 1
        else:
            out += nodelist[i]
            i += 1
    return out


def launch(env: Mapping[str, str] = os.environ) -> Launch:
    """Who this process is: torchrun's variables, else those of a Slurm job step (srun), else
    a process of its own."""
    if "WORLD_SIZE" in env:
        return Launch(int(env.get("RANK", "0")), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")))
    if "SLURM_STEP_ID" not in env or "SLURM_PROCID" not in env:  # not a task of srun (a batch script is not)
        return Launch()
    world = int(env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", "1")))
    if world < 2:
        return Launch()
    host = env.get("MASTER_ADDR") or first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
    low, high = SLURM_PORTS
    step = int(env["SLURM_STEP_ID"]) if is_digits(env["SLURM_STEP_ID"]) else 0
    port = env.get("MASTER_PORT") or str(low + (int(env.get("SLURM_JOB_ID", "0")) * 16 + step) % (high - low))
    return Launch(int(env["SLURM_PROCID"]), world, int(env.get("SLURM_LOCALID", "0")), f"tcp://{host or 'localhost'}:{port}")


def gpu_of(local_rank: int, visible: int) -> int:
    """The GPU a process takes: the one of its local rank among the node's `visible`, or the
    only one it sees (srun --gpus-per-task gives each task its own). More processes than GPUs
    on a node would put two on one GPU, which NCCL refuses only after the rendezvous
    ("Duplicate GPU detected"): refused here, naming the fix."""
    if visible == 1:
        return 0
    if local_rank >= visible:
        raise ConfigError(f"process {local_rank} of this node has no GPU of its own: the node shows {visible} GPUs; "
                          f"start at most {visible} processes per node (torchrun --nproc_per_node {visible})")
    return local_rank


def setup(device: str = "auto", parallel: str = "ddp") -> Context:
    """Join the process group when started by torchrun or srun; pick the device."""
    me = launch()
    dev = pick_device(device, "train.device=")
    if dev.type == "cuda":
        dev = torch.device("cuda", gpu_of(me.local_rank, torch.cuda.device_count()) if dev.index is None else dev.index)
        torch.cuda.set_device(dev)
    if me.world > 1 and not dist.is_initialized():
        # Before the group: see "Leaving cleanly" above. import_module, not `import torch._dynamo`,
        # which would make `torch` a local name of this whole function (ruff F823).
        importlib.import_module("torch._dynamo")

        where: dict[str, Any] = dict(init_method=me.init, rank=me.rank, world_size=me.world) if me.init else {}
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo",
                                device_id=dev if dev.type == "cuda" else None, **where)
    return Context(me.rank, me.world, me.local_rank, dev, parallel if me.world > 1 else "none")


def cleanup(ctx: Context) -> None:
    """Destroy the process group; the caller has let go of the modules that hold it (DDP's
    reducer, FSDP's units), so that its worker threads end here, not at interpreter exit."""
    if ctx.active and dist.is_initialized():
        gc.collect()  # the modules may sit in reference cycles
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
def no_sync(module: nn.Module, skip: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on all but the last micro-batch of an accumulated step."""
    wrapped: Any = module  # DDP's no_sync or FSDP2's set_requires_gradient_sync, where it has one
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


def _collective(run: Callable[[], Any], tensors: list[torch.Tensor], ctx: Context) -> None:
    """Run a collective over `tensors`, then, under gloo, wait until its worker thread has let
    go of them (see "Leaving cleanly" above); a moment, bounded at 5 s."""
    before = [t._use_count() for t in tensors]  # type: ignore[attr-defined]  # private, and undeclared in torch's stubs
    run()
    if dist.get_backend() != "gloo":  # NCCL's collectives run on the device's streams, not on threads
        return
    deadline = time.monotonic() + 5.0
    while any(t._use_count() > n for t, n in zip(tensors, before, strict=True)) and time.monotonic() < deadline:  # type: ignore[attr-defined]  # as above
        time.sleep(1e-4)


def sum_tensors(values: dict[str, torch.Tensor], ctx: Context) -> dict[str, torch.Tensor]:
    """Add each tensor across processes (in place, returned for convenience)."""
    if ctx.active:
        for v in values.values():
            _collective(functools.partial(dist.all_reduce, v, op=dist.ReduceOp.SUM), [v], ctx)
    return values


def any_flag(flag: bool, ctx: Context) -> bool:
    """True on every process if it is true on any (e.g. a NaN loss on one of them)."""
    if not ctx.active:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=ctx.device)
    _collective(lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX), [t], ctx)
    return bool(t.item() > 0)


def gather_objects(obj: Any, ctx: Context) -> list[Any]:
    """Every process's `obj`, in rank order (on every process). Pickled, as torch's
    all_gather_object does: the bytes come from this run's own processes."""
    if not ctx.active:
        return [obj]
    mine = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(ctx.device)
    size = torch.tensor([mine.numel()], device=ctx.device)
    sizes = [torch.zeros_like(size) for _ in range(ctx.world)]
    _collective(lambda: dist.all_gather(sizes, size), [size, *sizes], ctx)
    longest = max(int(n) for n in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=ctx.device)
    padded[: mine.numel()] = mine
    out = [torch.empty_like(padded) for _ in range(ctx.world)]
    _collective(lambda: dist.all_gather(out, padded), [padded, *out], ctx)
    return [pickle.loads(t[: int(n)].cpu().numpy().tobytes()) for t, n in zip(out, sizes, strict=True)]


def broadcast_object(obj: Any, ctx: Context) -> Any:
    """Rank 0's `obj` on every process."""
    return gather_objects(obj if ctx.is_main else None, ctx)[0]


def barrier(ctx: Context) -> None:
    """Every process waits for the others (an all-reduce: gloo's own barrier also holds the
    collectives still in flight, which it may let go of after the interpreter has gone)."""
    any_flag(False, ctx)


def full_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole tensors on the CPU: FSDP shards (DTensors) are gathered, which every process
    must call together; plain tensors are copied as they are."""
    return {k: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().contiguous() for k, t in state.items()}


def is_main_process() -> bool:
    """Rank 0 of a torchrun or srun launch (or a plain process): the one that writes files."""
    return launch().rank == 0


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
        raise ConfigError(f"train.precision=fp16 needs a CUDA GPU; this run is on {ctx.device.type}: use train.precision=bf16 (--bf16)")
    if ctx.parallel == "fsdp":
        raise ConfigError("train.precision=fp16 is not supported with FSDP (its scaler is sharded); use bf16")
