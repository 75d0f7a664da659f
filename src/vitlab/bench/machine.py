"""Reading the machine: other processes' CPU use, waiting for quiet, peak memory, what it is.

These machines are shared: another busy process on one of two cores halves the product rate.
`CpuMeter` reads /proc/stat and this process's own CPU time around an interval, so the CPU the
*other* processes used is known; `Waiter` sleeps (within a budget) until they are quiet.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import time
from typing import Callable, Optional

import torch

from vitlab.config import pick_device
from vitlab.config.device import cpu_name_and_flags
from vitlab.deploy.training import release_heap

_HZ = os.sysconf("SC_CLK_TCK")


def busy_jiffies() -> int:
    """All CPUs' non-idle time since boot (idle and iowait excluded), in clock ticks."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return sum(values) - values[3] - values[4]


def own_cpu_seconds() -> float:
    """This process's CPU time, its children's excluded (they are other processes)."""
    t = os.times()
    return t.user + t.system


def others_cores(busy_s: float, own_s: float, wall_s: float) -> float:
    """Other processes' CPU use in cores: machine busy time minus ours, over the wall time.
    The two clocks tick at different grains (jiffies and nanoseconds), so a small negative
    difference is rounding and reads as 0."""
    return max(0.0, busy_s - own_s) / max(wall_s, 1e-9)


class CpuMeter:
    """Other processes' CPU use (in cores) over the `with` block: `.others`, `.wall`."""

    def __enter__(self) -> "CpuMeter":
        self.wall0, self.busy0, self.own0 = time.perf_counter(), busy_jiffies(), own_cpu_seconds()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall0
        busy = (busy_jiffies() - self.busy0) / _HZ
        self.others = others_cores(busy, own_cpu_seconds() - self.own0, self.wall)


def wait_quiet(threshold_cores: float, max_wait: float, window: float = 0.2) -> float:
    """Sleep in short windows until the others use less than `threshold_cores`; returns the
    last window's use. Gives up after `max_wait` seconds (the sample is then judged by its
    own reading)."""
    deadline = time.perf_counter() + max_wait
    while True:
        with CpuMeter() as m:
            time.sleep(window)
        if m.others < threshold_cores or time.perf_counter() >= deadline:
            return m.others


class Waiter:
    """Waits for quiet before each sample, within a total budget, so that a busy machine cannot
    stretch a run without bound (its samples are then marked contended instead)."""

    def __init__(self, threshold_cores: float, max_wait: float, budget: float):
        self.threshold, self.max_wait, self.left = threshold_cores, max_wait, budget

    def __call__(self) -> None:
        if self.left <= 0:
            return
        t0 = time.perf_counter()
        wait_quiet(self.threshold, min(self.max_wait, self.left))
        self.left -= time.perf_counter() - t0


# Memory ----------------------------------------------------------------------------------


def status_bytes(key: str) -> int:
    """A size line of /proc/self/status ("VmRSS", "VmHWM"), in bytes; -1 where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def reset_peak_rss() -> int:
    """Return freed heap to the OS and reset the kernel's peak-RSS mark (VmHWM); returns the
    resident size in bytes, or -1 where the kernel does not allow the reset."""
    release_heap()  # glibc's malloc_trim, as the training step's kept heap gives memory back
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return -1
    return status_bytes("VmRSS")


def peak_added_mib(rss_before: int) -> float:
    """The peak resident memory added since `reset_peak_rss()` returned `rss_before`, in MiB."""
    if rss_before <= 0:
        return float("nan")
    return max(status_bytes("VmHWM") - rss_before, 0) / 2**20


def reset_peak_memory(device: str) -> int:
    """`reset_peak_rss()` on the CPU; on a GPU, reset the allocator's peak and return what
    is allocated now."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    return reset_peak_rss()


def peak_memory_added_mib(device: str, mark: int) -> float:
    """The peak memory added since `reset_peak_memory(device)` returned `mark`, in MiB."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        return max(torch.cuda.max_memory_allocated(device) - mark, 0) / 2**20
    return peak_added_mib(mark)


def check_device(device: str) -> str:
    """`device` (auto resolved) if this process can run on it; a ConfigError (a ValueError)
    naming the fix otherwise."""
    picked = pick_device(device)
    if picked.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: the benchmark runs on cpu or cuda")
    return str(picked)


def device_sync(device: str) -> Callable[[], None]:
    """A call that waits for the device's queued work (nothing to wait for on the CPU)."""
    if torch.device(device).type == "cuda":  # that device's queue: a bare synchronize() waits for the current one
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


# What the machine is ---------------------------------------------------------------------
ISA_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")


# Dense (no sparsity) tensor-core peaks in TFLOP/s, from the vendors' data sheets, for MFU:
# bf16 and fp16 with fp32 accumulation, fp32 on the CUDA cores (PyTorch's default keeps fp32
# products off TF32), int8 in TOPS. Matched against torch.cuda.get_device_name in order.
GPU_PEAKS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9, "int8": 1978.9}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.2, "int8": 1513.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9, "int8": 1978.9}),
    ("B200", {"bf16": 2250.0, "fp16": 2250.0, "fp32": 80.0, "int8": 4500.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5, "int8": 624.0}),
    ("L40S", {"bf16": 362.1, "fp16": 362.1, "fp32": 91.6, "int8": 733.0}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3, "int8": 242.5}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2, "int8": 250.0}),
    ("RTX 4090", {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6, "int8": 660.6}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
]


def device_peak_flops(device: str, dtype: str, name: Optional[str] = None) -> Optional[float]:
    """The device's nominal peak for a product dtype ("fp32", "bf16", "fp16", "int8") in
    FLOP/s, or None where it is not in the table (CPUs: their ceiling is measured instead)."""
    if torch.device(device).type != "cuda":
        return None
    name = name or torch.cuda.get_device_name(torch.device(device))
    for key, peaks in GPU_PEAKS:
        if key in name and dtype in peaks:
            return peaks[dtype] * 1e12
    return None


def machine_info(device: str = "cpu") -> dict[str, str]:
    """Where and with what the figures were measured: CPU (or GPU), cores, ISA, versions."""
    cpu, flags = cpu_name_and_flags()
    isa = [f for f in ISA_FLAGS if f in flags]
    info = {
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "threads": str(torch.get_num_threads()),
        "isa": " ".join(isa) or "-",
        "device": "cpu",
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if device.startswith("cuda"):
        info["device"] = torch.cuda.get_device_name(torch.device(device))
        kernels = [name for name, on in (("flash", torch.backends.cuda.flash_sdp_enabled()),
                                         ("memory-efficient", torch.backends.cuda.mem_efficient_sdp_enabled()),
                                         ("cuDNN", torch.backends.cuda.cudnn_sdp_enabled())) if on]
        info["isa"] = f"CUDA {torch.version.cuda}, SDPA kernels {'/'.join(kernels) or 'math only'}"
    for lib in ("timm", "transformers", "torchvision"):
        try:
            info[lib] = __import__(lib).__version__
        except ImportError:
            info[lib] = "not installed"
    return info
