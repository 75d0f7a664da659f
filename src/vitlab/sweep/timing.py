"""How long a sweep took, kept with its cells as evidence like its numbers.

Each cell's steps append to OUT/<cell>/timing.json as they run:

    {"steps": [{"step": "train", "start": 1764880000.1, "seconds": 95.2, "exit_code": 0,
                "machine": "AMD EPYC, AVX-512 (2 cores)", "threads": 1}, ...]}

A rerun that finds a step done records nothing for it; a resumed step adds an entry. From the
cells' entries, `summary` gives the sweep's wall time as the union of the intervals in which
some step ran (so a sweep stopped overnight and resumed is not charged for the night), how
many steps ran side by side at most, and the seconds summed over cells, training and after-steps
apart. Times are the machine's: a reader compares them within one machine, never across.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Iterable, Optional

from vitlab.config.device import cpu_name_and_flags
from vitlab.files import atomic_write_text
from vitlab.files.documents import read_json

FILE = "timing.json"
TRAIN_STEP = "train"
VECTOR_UNITS = (("amx_bf16", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"), ("asimd", "NEON"))


def machine() -> str:
    """This machine in a few words: the CPU's name, its widest vector instructions (a virtual
    machine often shows one name for CPU generations that differ in speed, and may differ in
    the last bits of their arithmetic) and the cores this process may use."""
    name, flags = cpu_name_and_flags()
    widest = next((label for flag, label in VECTOR_UNITS if flag in flags), platform.machine())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}, {widest} ({cores} cores)"


def read(cell_dir: Path) -> list[dict[str, Any]]:
    """The cell's step entries; none when the file is missing or unreadable (timing is a record,
    never a reason to stop a sweep)."""
    try:
        entries = read_json(cell_dir / FILE, {"steps": list}, "step timing")["steps"]
    except (OSError, ValueError):
        return []
    return [e for e in entries if isinstance(e, dict) and _number(e.get("start")) and _number(e.get("seconds"))]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


CAPABILITIES = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "asimd", "sve")


def provenance() -> dict[str, Any]:
    """What a cell's numbers may depend on beyond its settings: the torch version and the CPU's
    model and the vector capabilities its kernels choose between (a result bit-stable on one
    CPU kind may differ in the last bits, or past an early-stopping tie, on another)."""
    import torch

    name, flags = cpu_name_and_flags()
    return {"torch": torch.__version__, "cpu": name, "cpu_flags": [f for f in CAPABILITIES if f in flags]}


def record(cell_dir: Path, step: str, start: float, seconds: float, exit_code: int, threads: int) -> None:
    entries = read(cell_dir)
    entries.append({"step": step, "start": round(start, 3), "seconds": round(seconds, 3), "exit_code": exit_code,
                    "machine": machine(), "threads": threads or None, **provenance()})
    atomic_write_text(cell_dir / FILE, json.dumps({"steps": entries}, indent=1) + "\n")


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])  # an end before a start
    most = now = 0
    for _, change in events:
        now += change
        most = max(most, now)
    return most


def summary(cell_dirs: Iterable[Path]) -> Optional[dict[str, Any]]:
    """The sweep's time from its cells' entries, or None when no cell has any (a sweep run
    before timing.json was kept)."""
    entries = [e for d in cell_dirs for e in read(d)]
    if not entries:
        return None
    intervals = [(e["start"], e["start"] + e["seconds"]) for e in entries]
    train = sum(e["seconds"] for e in entries if e.get("step") == TRAIN_STEP)
    return {"wall_s": round(_union(intervals), 1), "side_by_side": _most_at_once(intervals),
            "train_s": round(train, 1), "after_s": round(sum(e["seconds"] for e in entries) - train, 1),
            "machines": sorted({str(e.get("machine")) for e in entries if e.get("machine")})}


def sentence(time: Optional[dict[str, Any]]) -> str:
    """The summary in words, for report.md and the page."""
    if time is None:
        return "No step times recorded (timing.json)."
    where = "; ".join(time["machines"]) or "an unrecorded machine"
    return (f"{time['wall_s'] / 60:.0f} minutes of wall time on {where}, at most {time['side_by_side']} "
            f"step(s) side by side; summed over cells, {time['train_s'] / 60:.0f} minutes of training and "
            f"{time['after_s'] / 60:.0f} of after-steps.")
