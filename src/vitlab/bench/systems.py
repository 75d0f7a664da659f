"""What is timed: a *setting* (a model, a batch size, a forward pass or a training step) and a
*system* (an implementation at a precision, eager or compiled), built into one call.

vitlab is built at each precision through its serving copies (`vitlab.deploy.copies`); the
peers are built by `vitlab.bench.peers` with the same sizes. Every call is warmed up before it
is handed to the runner, and the first call of a compiled system gives its compile time.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterable, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.bench import TASKS
from vitlab.bench.machine import device_sync, peak_memory_added_mib, reset_peak_memory
from vitlab.bench.peers import build_peer
from vitlab.config import ModelConfig
from vitlab.deploy import training
from vitlab.deploy.copies import for_precision
from vitlab.deploy.int8 import available as int8_available
from vitlab.models import Model, build

VITLAB_ONLY = ("fp32-packed", "fp32-auto", "int8")  # serving copies that only vitlab has
SERVING_COPIES = ("fp32-packed", "fp32-auto", "bf16", "fp16", "int8")  # vitlab.deploy.copies.for_precision
REDUCED = {"bf16": torch.bfloat16, "fp16": torch.float16}  # weights and activations in this dtype
TRAIN_PRECISIONS = ("fp32", "bf16-autocast", "fp16-autocast")
CPU_PRECISIONS = ("fp32", "fp32-packed", "fp32-auto", "bf16-autocast", "bf16", "int8")


@dataclass(frozen=True)
class Setting:
    """What is computed: one model at one batch size, a forward pass or a training step."""

    config: ModelConfig
    batch: int
    task: str = "infer"

    @property
    def label(self) -> str:
        h, w = self.config.image_size
        gelu = " gelu=exact" if getattr(self.config, "gelu", "") == "exact" else ""  # the variants default to tanh
        return f"{self.config.name}{gelu} {h}px b{self.batch} {self.task}"


@dataclass(frozen=True)
class System:
    """Who computes it: an implementation, a precision, eager or torch.compile. A ceiling is
    impl "gemm" with the kernel library that ran its products (see vitlab.bench.ceiling)."""

    impl: str
    precision: str = "fp32"
    compiled: bool = False
    kernel: str = ""
    checkpointing: bool = False  # training: recompute each block in the backward pass
    compile_mode: str = "default"  # torch.compile's mode; "reduce-overhead" replays CUDA graphs
    wrapper: bool = True  # training: vitlab's step as `vitlab train` runs it; False: as before issue 51

    @property
    def label(self) -> str:
        if self.impl == "gemm":
            return f"matmul ceiling {self.precision} ({self.kernel})"
        compiled = ""
        if self.compiled:
            compiled = " compiled" + ("" if self.compile_mode == "default" else f" ({self.compile_mode})")
        plain = "" if self.wrapper or self.impl != "vitlab" else " (plain step)"
        return f"{self.impl} {self.precision}{compiled}{plain}" + (" checkpointed" if self.checkpointing else "")


@dataclass
class Prepared:
    """One call of a system on a setting, warmed up and ready to time."""

    fn: Callable[[], object]
    compile_s: float = float("nan")
    work_mib: float = float("nan")  # peak resident memory one call adds


def build_model(impl: str, cfg: ModelConfig, precision: str = "fp32") -> nn.Module:
    """`impl`'s model; vitlab's with the attention kernel `vitlab train` builds for `precision`."""
    return build(cfg, training.training_attention(precision)) if impl == "vitlab" else build_peer(impl, cfg)


def _autocast(precision: str, device: str):
    dtype = {"bf16-autocast": torch.bfloat16, "fp16-autocast": torch.float16}.get(precision)
    return torch.autocast(torch.device(device).type, dtype=dtype) if dtype else nullcontext()


def inference_call(model: nn.Module, system: System, x: Tensor, device: str = "") -> Callable[[], Tensor]:
    """A forward pass under `inference_mode`: vitlab's serving copy for the precision, a peer
    cast to the reduced dtype (the peers have no packed copy) or as it is. `device`: where the
    bench put the model and `x` (default: x's device), which picks the layout and autocast."""
    model.eval()
    kind = torch.device(device or x.device).type
    if kind == "cuda":  # the layout GPU convolutions want: the peers' patch embedding, hybrid stems
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    if system.impl == "vitlab" and system.precision in SERVING_COPIES:
        # int8 on the CPU: oneDNN's kernels, calibrated on the timed batch (speed needs no real scales)
        calibrate = system.precision == "int8" and int8_available() and kind == "cpu"
        model = for_precision(cast(Model, model), system.precision, calibration=x if calibrate else None)  # (vitlab's)
    elif system.precision in REDUCED:
        model, x = model.to(REDUCED[system.precision]), x.to(REDUCED[system.precision])
    run = torch.compile(model, mode=system.compile_mode) if system.compiled else model
    autocast = _autocast(system.precision, kind)

    def forward() -> Tensor:
        with torch.inference_mode(), autocast:
            return run(x)

    return forward


def training_call(model: nn.Module, system: System, x: Tensor, y: Tensor, device: str = "",
                  wrapper: bool = True) -> Callable[[], Tensor]:
    """One AdamW step on cross-entropy, in fp32 or under bf16 (fp16, with loss scaling) autocast,
    on `device` (default: x's device). vitlab's step runs as `vitlab train` runs it (`wrapper`):
    torch's fused AdamW, freed tensors reused (`training.kept_heap`, here per step), the tanh GELU
    compiled (`training.fast_gelu`), the forward products on oneDNN's packed weights (bf16's, and
    fp32's where oneDNN was chosen) and in fp32 the Dense kernels chosen on this machine
    (`vitlab.deploy.training`); a peer's, and vitlab's with `wrapper=False` (the step before
    issue 51), torch's default AdamW (on the CPU its per-parameter loop) and the model's own ops."""
    if system.precision not in TRAIN_PRECISIONS:
        raise ValueError(f"a training step runs in {' or '.join(TRAIN_PRECISIONS)}, not {system.precision}")
    model.train()
    if system.checkpointing:  # vitlab and timm both name it so
        cast(Any, model).set_grad_checkpointing(True)
    step_model = torch.compile(model, mode=system.compile_mode) if system.compiled else model
    ours = wrapper and system.impl == "vitlab"
    fused = ours and training.fused_optimizer(model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)
    kind = torch.device(device or x.device).type
    plain_fp32 = system.precision == "fp32" and kind == "cpu" and not (system.compiled or system.checkpointing)
    shapes = training.chosen_shapes(model) if ours and plain_fp32 else []
    gelu = ours and training.gelu_for_run(None, kind == "cpu" and not (system.compiled or system.checkpointing),
                                           training.gelu_elements(model, len(x)))
    bf16 = system.precision == "bf16-autocast"
    packed = ours and training.packed_for_run(None, kind == "cpu" and not (system.compiled or system.checkpointing) and (
        bf16 or bool(shapes)), training.dense_elements(model, len(x)), torch.bfloat16 if bf16 else torch.float32)
    autocast = _autocast(system.precision, kind)
    scaler = torch.amp.GradScaler(kind, enabled=system.precision == "fp16-autocast")

    def step() -> Tensor:
        with training.kept_heap(ours and kind == "cpu", release=False):  # (glibc's own trimming between steps)
            with autocast, training.dense_kernels(shapes, packed), training.fast_gelu(gelu):
                loss = F.cross_entropy(step_model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            return loss

    return step


def prepare(setting: Setting, system: System, warmup: int = 2, device: str = "cpu") -> Prepared:
    """Build the model for `system`, warm it up (timing the first call if compiled) and
    measure the working memory of one steady call."""
    cfg, b = setting.config, setting.batch
    if system.impl != "vitlab" and system.precision in VITLAB_ONLY:
        raise ValueError(f"{system.precision} is measured for vitlab only")
    if setting.task not in TASKS:
        raise ValueError(f"task {setting.task!r} is not one of {TASKS}")
    torch.manual_seed(0)
    model = build_model(system.impl, cfg, system.precision).to(device)
    x = torch.randn(b, cfg.in_channels, *cfg.image_size, device=device)
    if setting.task == "infer":
        fn = inference_call(model, system, x, device)
    else:
        y = torch.randint(0, cfg.num_classes, (b,), generator=torch.Generator().manual_seed(0)).to(device)
        fn = training_call(model, system, x, y, device, system.wrapper)
    return warm_up(fn, warmup, system.compiled, device)


def warm_up(fn: Callable[[], object], warmup: int, compiled: bool, device: str = "cpu") -> Prepared:
    """Call `fn` `warmup` times, then once more with the peak-memory mark reset (resident
    memory on the CPU, allocated memory on a GPU): the first call minus a steady one is the
    compile time of a compiled system."""
    sync = device_sync(device)
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    for _ in range(max(warmup - 1, 0)):
        fn()
    training.release_heap()  # every system's measured call starts from a heap given back (kept_heap)
    mark = reset_peak_memory(device)
    t0 = time.perf_counter()
    fn()
    sync()
    steady = time.perf_counter() - t0
    prepared = Prepared(fn, work_mib=peak_memory_added_mib(device, mark))
    if compiled:
        prepared.compile_s = max(first - steady, 0.0)
    return prepared


def standard_systems(task: str, peers: Iterable[str] = ("timm", "hf", "torchvision"),
                     compiled: Iterable[str] = (), precisions: Iterable[str] = CPU_PRECISIONS,
                     compile_mode: str = "default") -> list[System]:
    """vitlab at each precision; each peer at fp32 and the autocast precisions (timm also with
    bf16 or fp16 weights); `compiled`: the precisions at which torch.compile'd vitlab is timed too."""
    precisions = list(precisions)
    if task == "train":
        precisions = [p for p in precisions if p in TRAIN_PRECISIONS]
    systems = [System("vitlab", p) for p in precisions]
    for peer in peers:
        systems += [System(peer, p) for p in precisions if p in ("fp32", "bf16-autocast", "fp16-autocast")]
        if peer == "timm" and task == "infer":
            systems += [System(peer, p) for p in precisions if p in REDUCED]
    systems += [System("vitlab", p, compiled=True, compile_mode=compile_mode)
                for p in compiled if task == "infer" or p in TRAIN_PRECISIONS]
    return systems
