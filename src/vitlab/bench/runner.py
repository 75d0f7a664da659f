"""Timing: interleaved rounds, medians of clean samples, ratios taken within a round.

What one run measures, for each setting and each system:

- images per second: the median over rounds, with the spread (min-max) of the clean samples;
- the matrix-product ceiling of the same setting, measured in the same rounds (see
  `vitlab.bench.ceiling`); each figure is also a fraction of it: nominal model FLOPs x
  images/s / ceiling;
- the ratio to the fastest fp32 eager peer and to timm fp32, taken within a round (both
  samples from the same minute, so a slow minute cancels out), then the median over rounds;
- working memory and, for compiled systems, compile time (see `vitlab.bench.systems`).

Noise protocol. Before each sample the runner waits (bounded) for the machine to be quiet;
around each sample it reads how much CPU the other processes used (`vitlab.bench.machine`).
Samples where they used more than `contended_cores` are marked contended and left out of the
medians and ratios while clean samples exist. The order of systems is shuffled in every round.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from vitlab.bench.ceiling import ceiling_call, ceiling_precision, kernels
from vitlab.bench.machine import CpuMeter, Waiter, device_peak_flops, device_sync
from vitlab.bench.systems import Prepared, Setting, System, prepare
from vitlab.config import model_flops

Log = Callable[[str], None]


@dataclass
class Sample:
    round: int
    rate: float  # images/s, or FLOP/s for a ceiling
    others: float  # other processes' CPU use during the sample, in cores
    contended: bool


@dataclass
class Row:
    """The figures of one system on one setting (or of a ceiling: impl "gemm")."""

    setting: Setting
    system: System
    samples: list[Sample] = field(default_factory=list)
    ceiling: Optional[float] = None  # FLOP/s of the setting's products in this dtype
    peak: Optional[float] = None  # the device's nominal peak for the dtype (GPUs), for MFU
    vs_peer: Optional[float] = None  # median within-round ratio to the fastest fp32 eager peer
    vs_timm: Optional[float] = None
    compile_s: float = float("nan")
    work_mib: float = float("nan")
    error: str = ""

    def clean(self) -> list[float]:
        """The clean samples' rates, or all of them where none is clean."""
        good = [s.rate for s in self.samples if not s.contended]
        return good or [s.rate for s in self.samples]

    @property
    def n_clean(self) -> int:
        return sum(not s.contended for s in self.samples)

    @property
    def median(self) -> float:
        rates = self.clean()
        return statistics.median(rates) if rates else float("nan")

    @property
    def flops_per_image(self) -> float:
        f = model_flops(self.setting.config)
        return 3 * f if self.setting.task == "train" else f  # backward ~ 2x forward

    @property
    def fraction(self) -> Optional[float]:
        if self.ceiling is None or not self.samples:
            return None
        return self.flops_per_image * self.median / self.ceiling

    @property
    def mfu(self) -> Optional[float]:
        """Model FLOPs utilisation: nominal FLOPs x images/s over the device's peak."""
        if self.peak is None or not self.samples:
            return None
        return self.flops_per_image * self.median / self.peak


@dataclass
class BenchConfig:
    rounds: int = 3
    min_time: float = 1.0  # seconds per sample
    min_calls: int = 2
    contended_cores: float = 0.1  # others' CPU use above which a sample is contended
    max_wait: float = 3.0  # seconds to wait for quiet before each sample
    wait_budget: float = 120.0  # seconds of waiting in the whole run; then samples go ahead
    seed: int = 0
    # "wall": wall-clock time with PyTorch's threads (the real figures; needs a quiet machine).
    # "cpu": one thread, timed by its own CPU time, which other processes cannot inflate: the
    # figures are single-core ones, but the comparisons hold on a busy machine. Samples are
    # then never dropped (others' CPU use is still recorded).
    clock: str = "wall"
    device: str = "cpu"  # "cuda" times on the GPU (wall clock, synchronised after each sample)
    warmup: int = 2  # calls of each system before its memory is measured and its samples taken

    def waiter(self) -> Waiter:
        return Waiter(self.contended_cores, self.max_wait, self.wait_budget)


def time_calls(fn: Callable[[], object], min_time: float, min_calls: int, clock: str = "wall",
               sync: Callable[[], None] = lambda: None) -> tuple[float, float, int]:
    """Call `fn` at least `min_calls` times and for at least `min_time` s; returns (seconds
    per call, others' CPU in cores, calls). `clock="cpu"` counts this thread's CPU time
    instead of wall time (see BenchConfig.clock); `sync` waits for queued device work."""
    timer = time.thread_time if clock == "cpu" else time.perf_counter
    calls = 0
    with CpuMeter() as meter:
        sync()
        t0, w0 = timer(), time.perf_counter()
        while calls < min_calls or time.perf_counter() - w0 < min_time:
            fn()
            calls += 1
        sync()
        elapsed = timer() - t0
    return elapsed / calls, meter.others, calls


def prepare_all(setting: Setting, systems: Sequence[System], bench: BenchConfig,
                log: Log) -> tuple[dict[System, Row], dict[System, Prepared]]:
    """Build every system; one that cannot build this setting is reported in its row, not fatal."""
    rows: dict[System, Row] = {}
    prepared: dict[System, Prepared] = {}
    for system in systems:
        row = rows[system] = Row(setting, system)
        try:
            p = prepared[system] = prepare(setting, system, warmup=bench.warmup, device=bench.device)
            row.compile_s, row.work_mib = p.compile_s, p.work_mib
        except Exception as e:  # a peer lacking a feature (a GAP head, ...) is one skipped row
            row.error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            log(f"  {setting.label} / {system.label}: skipped ({row.error})")
    return rows, prepared


def ceiling_systems(systems: Sequence[System], device: str) -> list[System]:
    """One "gemm" system per product dtype the systems use and kernel that can run it."""
    dtypes = sorted({ceiling_precision(s.precision) for s in systems})
    return [System("gemm", p, kernel=k) for p in dtypes for k in kernels(p, device)]


def run_setting(setting: Setting, systems: Sequence[System], bench: BenchConfig,
                log: Log = lambda s: None, waiter: Optional[Waiter] = None) -> list[Row]:
    """Build every system, then time them in `bench.rounds` shuffled rounds with the ceilings."""
    waiter = waiter or bench.waiter()
    rows, prepared = prepare_all(setting, systems, bench, log)
    calls: dict[System, tuple[Callable[[], object], float, int]] = {}  # (fn, work per call, calls)
    for system, p in prepared.items():
        calls[system] = (p.fn, float(setting.batch), bench.min_calls)
    gemms = ceiling_systems(list(prepared), bench.device)
    for g in gemms:
        products, flops = ceiling_call(setting.config, setting.batch, g.precision, bench.device, g.kernel)
        calls[g] = (products, flops, 3)
    samples: dict[System, list[Sample]] = {key: [] for key in calls}
    sync, rng = device_sync(bench.device), random.Random(bench.seed)
    for r in range(bench.rounds):
        order = list(calls)
        rng.shuffle(order)
        for key in order:
            waiter()
            fn, work, min_calls = calls[key]
            min_time = bench.min_time / 2 if key.impl == "gemm" else bench.min_time
            sec, others, _ = time_calls(fn, min_time, min_calls, bench.clock, sync)
            contended = bench.clock == "wall" and others > bench.contended_cores
            samples[key].append(Sample(r, work / sec, others, contended))
        log(f"  {setting.label}: round {r + 1}/{bench.rounds} done")
    gemm_rows = [Row(setting, g, samples[g]) for g in gemms]
    for system, row in rows.items():
        row.samples = samples.get(system, [])
        if system in prepared:  # the fastest kernel for this dtype
            dtype = ceiling_precision(system.precision)
            row.ceiling = max(g.median for g in gemm_rows if g.system.precision == dtype)
            row.peak = device_peak_flops(bench.device, dtype)
    ratios(list(rows.values()))
    return list(rows.values()) + gemm_rows


def ratios(rows: list[Row]) -> None:
    """Per round: each row's rate over the fastest fp32 eager peer's (and timm's), clean pairs
    only (all pairs if no round has a clean pair); the median over rounds."""
    peers = [r for r in rows if r.system.impl not in ("vitlab", "gemm") and r.system.precision == "fp32"
             and not r.system.compiled and r.samples]
    timm = [r for r in peers if r.system.impl == "timm"]
    for row in rows:
        if row.samples:
            row.vs_peer = median_ratio(row, peers)
            row.vs_timm = median_ratio(row, timm)


def median_ratio(row: Row, refs: list[Row]) -> Optional[float]:
    """The median over rounds of row's rate / the best of `refs` in the same round."""
    if not refs:
        return None

    def per_round(clean_only: bool) -> list[float]:
        out = []
        for s in row.samples:
            if clean_only and s.contended:
                continue
            best = [x.rate for ref in refs for x in ref.samples
                    if x.round == s.round and not (clean_only and x.contended)]
            if len(best) == len(refs):
                out.append(s.rate / max(best))
        return out

    values = per_round(True) or per_round(False)
    return statistics.median(values) if values else None


def run(plan: Sequence[tuple[Setting, Sequence[System]]], bench: Optional[BenchConfig] = None,
        log: Log = lambda s: None, progress: Optional[Callable[[list[Row]], None]] = None) -> list[Row]:
    """Run a plan setting by setting; `progress(rows_so_far)` after each (to save partial results)."""
    bench = bench if bench is not None else BenchConfig()
    if bench.clock not in ("wall", "cpu"):
        raise ValueError(f"clock {bench.clock!r} is not 'wall' or 'cpu'")
    rows: list[Row] = []
    threads = torch.get_num_threads()
    if bench.clock == "cpu":
        torch.set_num_threads(1)
        bench = dataclasses.replace(bench, wait_budget=0.0)  # waiting buys nothing here
    try:
        waiter = bench.waiter()
        for setting, systems in plan:
            log(f"{setting.label}: {len(systems)} systems")
            rows += run_setting(setting, systems, bench, log, waiter)
            if progress is not None:
                progress(rows)
    finally:
        torch.set_num_threads(threads)
    return rows
