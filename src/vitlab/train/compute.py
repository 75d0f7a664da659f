"""What a run costs: FLOPs, wall time, CPU- or GPU-seconds, and the device.

The paper compares models at equal pretraining compute (Fig. 5: exaFLOPs on the x-axis;
Table 2: TPUv3-core-days). A run counts the same way:

    forward FLOPs per image   `model_flops(config)`, the number `vitlab models` prints
    training FLOPs            3 x forward x images seen (the backward pass costs about
                              twice the forward: one product for the inputs' gradients,
                              one for the weights')
    wall time, CPU-seconds    this process's clock and CPU time (all its threads)
    GPU-seconds               wall time x the accelerators the run holds

`ComputeMeter` keeps the totals; its `state_dict` goes into a training checkpoint so that a
resumed run keeps counting from where it stopped. The trainer adds up the CPU-seconds of its
processes.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Any, Optional

from vitlab.config import ModelConfig, model_flops

# Forward + backward ~ 3 forwards (the "3" of 3 x forward x images above).
TRAIN_FACTOR = 3.0
# The fields a summary carries, in the order they are printed.
FIELDS = ("forward_gflops", "images_seen", "train_flops", "wall_s", "cpu_s", "gpu_s", "device")


def training_flops(config: ModelConfig, images: float) -> float:
    """Forward and backward FLOPs of training on `images` images: 3 x forward x images."""
    return TRAIN_FACTOR * model_flops(config) * images


def describe_device(device: Any, processes: int = 1) -> str:
    """ "cpu (2 threads, x86_64, ...)" or "cuda: 4 x NVIDIA H200": what the run ran on, in words."""
    import torch  # torch is needed only here; the rest of the module is arithmetic

    kind = getattr(device, "type", str(device)).split(":")[0]
    if kind == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(device))
        return f"cuda: {processes} x {name}" if processes > 1 else f"cuda: {name}"
    if kind == "mps":
        return "mps (Apple GPU)"
    threads = torch.get_num_threads()
    procs = f"{processes} processes x " if processes > 1 else ""
    plural = "s" if threads > 1 else ""
    return f"cpu ({procs}{threads} thread{plural}, {platform.machine() or 'unknown'}, {os.cpu_count()} cores seen)"


class ComputeMeter:
    """Running compute totals of one run. `step(images)` after each optimiser step (global
    images, all processes); `summary()` for metrics.jsonl, summary.json and the final print."""

    STATE = ("images", "forward_images", "wall_s", "cpu_s")  # the totals a checkpoint keeps

    def __init__(self, config: ModelConfig, device: Any = "cpu", processes: int = 1):
        self.forward_flops = model_flops(config)
        self.processes = processes
        self.accelerators = processes if getattr(device, "type", str(device)).startswith(("cuda", "mps")) else 0
        self.device = describe_device(device, processes)
        self.images = 0
        self.forward_images = 0  # images that only went forward (a probe head's features)
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self._mark: Optional[tuple[float, float]] = None

    # The clock runs between start() and pause(); evaluation may be counted or left out.
    def start(self) -> None:
        self._mark = (time.perf_counter(), time.process_time())

    def pause(self) -> None:
        self._advance()
        self._mark = None

    def _advance(self) -> None:
        if self._mark is None:
            return
        wall, cpu = time.perf_counter(), time.process_time()
        self.wall_s += wall - self._mark[0]
        self.cpu_s += cpu - self._mark[1]
        self._mark = (wall, cpu)

    def step(self, images: int) -> None:
        self.images += int(images)

    def forward_only(self, images: int) -> None:
        """Count images that went through the model forward only (1 x, not 3 x its FLOPs), on
        all processes together."""
        self.forward_images += int(images)

    def summary(self, cpu_s: Optional[float] = None) -> dict[str, Any]:
        """The totals so far; `cpu_s` replaces this process's CPU time (the sum over processes)."""
        self._advance()
        out = {
            "forward_gflops": self.forward_flops / 1e9,
            "images_seen": self.images,
            "train_flops": self.forward_flops * (TRAIN_FACTOR * self.images + self.forward_images),
            "wall_s": round(self.wall_s, 3),
            "cpu_s": round(self.cpu_s if cpu_s is None else cpu_s, 3),
            "gpu_s": round(self.wall_s * self.accelerators, 3),
            "device": self.device,
        }
        return {**out, "forward_images": self.forward_images} if self.forward_images else out

    def state_dict(self) -> dict[str, float]:
        self._advance()
        return {k: getattr(self, k) for k in self.STATE}

    def load_state_dict(self, state: dict[str, float]) -> None:
        for k in self.STATE:  # each as its own type (counts int, seconds float), 0 when absent
            setattr(self, k, type(getattr(self, k))(state.get(k, 0)))


def _flops_words(flops: float) -> str:
    for unit, scale in (("EFLOPs", 1e18), ("PFLOPs", 1e15), ("TFLOPs", 1e12), ("GFLOPs", 1e9)):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.3g} FLOPs"


def format_compute(summary: dict[str, Any]) -> str:
    """One line for the end of a run: 'compute  1.2 PFLOPs (0.38 GFLOPs/image x 3 x 1.1M
    images), 610 s wall, 1180 CPU-s on cpu (2 threads, ...)'."""
    seconds = f"{summary['gpu_s']:.0f} GPU-s" if summary.get("gpu_s") else f"{summary['cpu_s']:.0f} CPU-s"
    forward = f" + 1 x {summary['forward_images']:,} forward only" if summary.get("forward_images") else ""
    return (
        f"compute  {_flops_words(summary['train_flops'])} ({summary['forward_gflops']:.3g} GFLOPs/image x 3 x "
        f"{summary['images_seen']:,} images{forward}), {summary['wall_s']:.0f} s wall, {seconds} on {summary['device']}"
    )
