"""Which device a setting names, and whether this machine has it.

One place for every command and the trainer, so that `--device`, `train.device=` and the
benchmark's `--device` accept the same words and refuse the same way. The form is checked
when a config is built (a config may be written on a laptop for a GPU cluster); whether the
hardware is there is checked only when a device is picked for work.
"""

from __future__ import annotations

import platform
import re
from typing import Optional

from vitlab.config.fields import ConfigError

FORMS = "auto, cpu, cuda, cuda:N or mps"


def form_problem(text: str) -> Optional[str]:
    """Why `text` is not a device word, or None."""
    if re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", text):
        return None
    return f"not a device; use {FORMS}"


def pick_device(text: str, setting: str = "--device "):
    """`text` as a torch.device this machine has ("auto": a CUDA GPU when there is one, else
    the CPU). A ConfigError otherwise, naming the setting as the user spells it (`setting`,
    "--device " or "train.device=") and the fix."""
    import torch

    problem = form_problem(text)
    if problem:
        raise ConfigError(f"{setting}{text}: {problem}")
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(text)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{setting}{text}: torch sees no CUDA GPU on this machine; use {setting}cpu (or {setting}auto)")
        count = torch.cuda.device_count()
        if (device.index or 0) >= count:
            raise ConfigError(f"{setting}{text}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{setting}{text}: Apple's Metal backend (mps) is not available here; use {setting}cpu")
    return device


def cpu_name_and_flags() -> tuple[str, set[str]]:
    """The CPU's name and its instruction-set flags, as /proc/cpuinfo gives them (the name
    from the platform module where there is no such file)."""
    cpu, flags = platform.processor() or "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and cpu in ("", "unknown CPU", platform.machine()):
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return cpu, flags
