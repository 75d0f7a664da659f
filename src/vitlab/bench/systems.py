"""What is timed: a *setting* (a model, a batch size, a forward pass or a training step) and a
*system* (an implementation at a precision, eager or compiled), built into one call.

vitlab is built at each precision through its serving copies (`vitlab.deploy.serving`); the
peers are built by `vitlab.bench.peers` with the same sizes. Every call is warmed up before it
is handed to the runner, and the first call of a compiled system gives its compile time.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.bench import PRECISIONS, TASKS
from vitlab.bench.machine import peak_added_mib, reset_peak_rss
from vitlab.bench.peers import build_peer
from vitlab.config import ViTConfig
from vitlab.deploy.int8 import available as int8_available
from vitlab.deploy.serving import for_precision
from vitlab.models.vit import VisionTransformer

VITLAB_ONLY = ("fp32-packed", "int8")  # serving copies that only vitlab has
IMPLS = ("vitlab", "timm", "hf", "torchvision")
TRAIN_PRECISIONS = ("fp32", "bf16-autocast")


@dataclass(frozen=True)
class Setting:
    """What is computed: one model at one batch size, a forward pass or a training step."""

    config: ViTConfig
    batch: int
    task: str = "infer"

    @property
    def label(self) -> str:
        h, w = self.config.image_size
        gelu = " gelu=exact" if self.config.gelu == "exact" else ""  # the variants default to tanh
        return f"{self.config.name}{gelu} {h}px b{self.batch} {self.task}"


@dataclass(frozen=True)
class System:
    """Who computes it: an implementation, a precision, eager or torch.compile. A ceiling is
    impl "gemm" with the kernel library that ran its products (see vitlab.bench.ceiling)."""

    impl: str
    precision: str = "fp32"
    compiled: bool = False
    kernel: str = ""

    @property
    def label(self) -> str:
        if self.impl == "gemm":
            return f"matmul ceiling {self.precision} ({self.kernel})"
        return f"{self.impl} {self.precision}" + (" compiled" if self.compiled else "")


@dataclass
class Prepared:
    """One call of a system on a setting, warmed up and ready to time."""

    fn: Callable[[], object]
    compile_s: float = float("nan")
    work_mib: float = float("nan")  # peak resident memory one call adds


def build_model(impl: str, cfg: ViTConfig) -> nn.Module:
    return VisionTransformer(cfg) if impl == "vitlab" else build_peer(impl, cfg)


def _autocast(precision: str, device: str):
    if precision == "bf16-autocast":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    if precision == "fp16-autocast":
        return torch.autocast(torch.device(device).type, dtype=torch.float16)
    return nullcontext()


def inference_call(model: nn.Module, system: System, x: Tensor) -> Callable[[], Tensor]:
    """A forward pass under `inference_mode`: vitlab's serving copy for the precision, a peer
    cast to bf16 for "bf16" (the peers have no packed copy) or as it is."""
    model.eval()
    if system.precision in ("fp32-packed", "bf16", "int8"):
        if system.impl == "vitlab":  # int8: oneDNN's kernels, calibrated on the timed batch
            calibrate = system.precision == "int8" and int8_available() and x.device.type == "cpu"
            model = for_precision(model, system.precision, calibration=x if calibrate else None)
        else:
            model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    if system.compiled:
        model = torch.compile(model)
    autocast = _autocast(system.precision, x.device.type)

    def forward() -> Tensor:
        with torch.inference_mode(), autocast:
            return model(x)

    return forward


def training_call(model: nn.Module, system: System, x: Tensor, y: Tensor) -> Callable[[], Tensor]:
    """One AdamW step on cross-entropy, in fp32 or under bf16 autocast."""
    if system.precision not in TRAIN_PRECISIONS:
        raise ValueError(f"a training step runs in {' or '.join(TRAIN_PRECISIONS)}, not {system.precision}")
    model.train()
    step_model = torch.compile(model) if system.compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = _autocast(system.precision, x.device.type)

    def step() -> Tensor:
        with autocast:
            loss = F.cross_entropy(step_model(x), y)
        loss.backward()
        optimizer.step()
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
    model = build_model(system.impl, cfg).to(device)
    x = torch.randn(b, cfg.in_channels, *cfg.image_size, device=device)
    if setting.task == "infer":
        fn = inference_call(model, system, x)
    else:
        y = torch.randint(0, cfg.num_classes, (b,), generator=torch.Generator().manual_seed(0)).to(device)
        fn = training_call(model, system, x, y)
    return warm_up(fn, warmup, system.compiled)


def warm_up(fn: Callable[[], object], warmup: int, compiled: bool) -> Prepared:
    """Call `fn` `warmup` times, then once more with the peak-RSS mark reset: the first call
    minus a steady one is the compile time of a compiled system."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    for _ in range(max(warmup - 1, 0)):
        fn()
    rss = reset_peak_rss()
    t0 = time.perf_counter()
    fn()
    steady = time.perf_counter() - t0
    prepared = Prepared(fn, work_mib=peak_added_mib(rss))
    if compiled:
        prepared.compile_s = max(first - steady, 0.0)
    return prepared


def standard_systems(task: str, peers: Iterable[str] = ("timm", "hf", "torchvision"),
                     compiled: Iterable[str] = (), precisions: Iterable[str] = PRECISIONS) -> list[System]:
    """vitlab at each precision; each peer at fp32 and bf16 autocast (timm also with bf16
    weights); `compiled` lists the precisions at which torch.compile'd vitlab is timed too."""
    precisions = list(precisions)
    if task == "train":
        precisions = [p for p in precisions if p in TRAIN_PRECISIONS]
    systems = [System("vitlab", p) for p in precisions]
    for peer in peers:
        systems += [System(peer, p) for p in precisions if p in ("fp32", "bf16-autocast")]
        if peer == "timm" and "bf16" in precisions and task == "infer":
            systems.append(System(peer, "bf16"))
    systems += [System("vitlab", p, compiled=True) for p in compiled]
    return systems
