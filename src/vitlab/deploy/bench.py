"""Throughput of vitlab against timm, Hugging Face and torchvision, in one interleaved run.

What one run measures, for each *setting* (a model, a batch size, inference or a training
step) and each *system* (an implementation at a precision, eager or compiled):

- images per second: median over rounds, with the spread (min-max) of the clean samples;
- the matrix-product ceiling of the same setting, measured in the same round: the model's own
  Dense shapes (M = batch x tokens; qkv, projection, MLP in and out) in the system's dtype.
  Each figure is also given as a fraction of it: nominal model FLOPs x images/s / ceiling;
- the ratio to the fastest fp32 eager peer and to timm fp32, taken within a round (both
  samples from the same minute, so a slow minute cancels out), then the median over rounds;
- working memory: the peak resident memory a call adds on top of what is already resident;
- compile time for compiled systems (the first call).

Noise protocol. These machines are shared: another busy process on one of two cores halves
the product rate. Before each sample the runner waits (bounded) for the machine to be quiet;
around each sample it reads /proc/stat and this process's own CPU time, so the other
processes' CPU use during the sample is known. Samples where others used more than
`contended_cores` of a core are marked contended and left out of the medians and ratios
while clean samples exist. The order of systems is shuffled in every round.
"""

from __future__ import annotations

import csv
import ctypes
import dataclasses
import datetime as _dt
import os
import platform
import random
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.bench import PRECISIONS as BENCH_PRECISIONS
from vitlab.bench import TASKS as BENCH_TASKS
from vitlab.config import BiTConfig, ModelConfig, model_flops
from vitlab.models import build

# The names live in vitlab.config, so the command line can offer them without importing torch.
TASKS = BENCH_TASKS
SYSTEM_PRECISIONS = BENCH_PRECISIONS
VITLAB_ONLY = ("fp32-packed", "int8")
IMPLS = ("vitlab", "timm", "hf", "torchvision")


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
    """Who computes it: an implementation, a precision, eager or torch.compile."""

    impl: str
    precision: str = "fp32"
    compiled: bool = False

    @property
    def label(self) -> str:
        return f"{self.impl} {self.precision}" + (" compiled" if self.compiled else "")


# Reading the machine --------------------------------------------------------------------
_HZ = os.sysconf("SC_CLK_TCK")


def _busy_jiffies() -> int:
    """All CPUs' non-idle time since boot (idle and iowait excluded), in clock ticks."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return sum(values) - values[3] - values[4]


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class CpuMeter:
    """Other processes' CPU use (in cores) over an interval: machine busy time minus ours."""

    def __enter__(self) -> "CpuMeter":
        self.wall0, self.busy0, self.own0 = time.perf_counter(), _busy_jiffies(), _own_cpu_seconds()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall0
        busy = (_busy_jiffies() - self.busy0) / _HZ
        own = _own_cpu_seconds() - self.own0
        self.others = max(0.0, busy - own) / max(self.wall, 1e-9)  # cores


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


_LIBC = None


def _reset_peak_rss() -> int:
    """Return freed heap to the OS, reset the kernel's peak-RSS mark; returns the RSS (bytes)."""
    global _LIBC
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL("libc.so.6")
        _LIBC.malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return -1
    return _status_bytes("VmRSS")


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return -1


def machine_info() -> dict[str, str]:
    """Where and with what the figures were measured: CPU, cores, ISA, library versions."""
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
    isa = [f for f in ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8") if f in flags]
    info = {
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "threads": str(torch.get_num_threads()),
        "isa": " ".join(isa) or "-",
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    for lib in ("timm", "transformers", "torchvision"):
        try:
            info[lib] = __import__(lib).__version__
        except ImportError:
            info[lib] = "not installed"
    return info


# Building what is timed ------------------------------------------------------------------
@dataclass
class Runner:
    """One call of a system on a setting, ready to time."""

    fn: Callable[[], object]
    compile_s: float = float("nan")
    work_mib: float = float("nan")


def _build_model(impl: str, cfg: ModelConfig) -> nn.Module:
    if impl == "vitlab":
        return build(cfg)
    from vitlab.deploy.peers import build_peer

    return build_peer(impl, cfg)


def _gemm_shapes(cfg: ModelConfig) -> tuple[int, list[tuple[int, int]]]:
    """(rows per image, (in, out) of each product): the Dense layers of one encoder block
    (Eq. 2-3), or for a BiT ResNet the two 1x1 convolutions of a unit of its third stage
    (where most of its FLOPs are), as matrix products over the map's positions."""
    if isinstance(cfg, BiTConfig):
        s = min(2, len(cfg.layers) - 1)
        stride = (4 if cfg.stem == "bit" else 1) * 2**s
        mid = cfg.stage_widths[s]
        return (cfg.image_size[0] // stride) * (cfg.image_size[1] // stride), [(4 * mid, mid), (mid, 4 * mid)]
    d = cfg.hidden_size
    return cfg.num_tokens, [(d, 3 * d), (d, d), (d, cfg.mlp_dim), (cfg.mlp_dim, d)]


def ceiling_runner(setting: Setting, precision: str) -> tuple[Runner, float]:
    """The matrix products of one block at the setting's shapes; returns (runner, FLOPs per call)."""
    rows, shapes = _gemm_shapes(setting.config)
    m = setting.batch * rows
    flops = float(sum(2 * m * k * n for k, n in shapes))
    g = torch.Generator().manual_seed(0)
    if precision == "int8":
        xs = [torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g) for k, _ in shapes]
        ws = [torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g) for k, n in shapes]

        def fn():
            for x, w in zip(xs, ws):
                torch._int_mm(x, w.t())
    else:
        dtype = torch.float32 if precision == "fp32" else torch.bfloat16
        xs = [torch.randn(m, k, generator=g).to(dtype) for k, _ in shapes]
        ws = [torch.randn(n, k, generator=g).to(dtype) for k, n in shapes]

        def fn():
            for x, w in zip(xs, ws):
                F.linear(x, w)

    return Runner(fn), flops


def ceiling_precision(precision: str) -> str:
    return {"fp32": "fp32", "fp32-packed": "fp32", "bf16-autocast": "bf16", "bf16": "bf16", "int8": "int8"}[precision]


def build_runner(setting: Setting, system: System, warmup: int = 2) -> Runner:
    """Build the model for `system`, warm it up (timing the first call if compiled)."""
    cfg, b = setting.config, setting.batch
    if system.impl != "vitlab" and system.precision in VITLAB_ONLY:
        raise ValueError(f"{system.precision} is measured for vitlab only")
    torch.manual_seed(0)
    model = _build_model(system.impl, cfg)
    x = torch.randn(b, cfg.in_channels, *cfg.image_size)
    autocast = (
        torch.autocast("cpu", dtype=torch.bfloat16) if system.precision == "bf16-autocast" else nullcontext()
    )
    if setting.task == "infer":
        model.eval()
        if system.precision in ("fp32-packed", "bf16", "int8"):
            if system.impl == "vitlab":
                from vitlab.deploy.serving import for_precision

                model = for_precision(model, system.precision)
            else:
                model = model.to(torch.bfloat16)
                x = x.to(torch.bfloat16)
        if system.compiled:
            model = torch.compile(model)

        def fn():
            with torch.inference_mode(), autocast:
                return model(x)

    elif setting.task == "train":
        if system.precision not in ("fp32", "bf16-autocast"):
            raise ValueError(f"a training step runs in fp32 or bf16-autocast, not {system.precision}")
        model.train()
        y = torch.randint(0, cfg.num_classes, (b,), generator=torch.Generator().manual_seed(0))
        step_model = torch.compile(model) if system.compiled else model
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def fn():
            with autocast:
                loss = F.cross_entropy(step_model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss

    else:
        raise ValueError(f"task {setting.task!r} is not one of {TASKS}")

    runner = Runner(fn)
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    for _ in range(max(warmup - 1, 0)):
        fn()
    rss = _reset_peak_rss()
    t0 = time.perf_counter()
    fn()
    steady = time.perf_counter() - t0
    if rss > 0:
        runner.work_mib = max(_status_bytes("VmHWM") - rss, 0) / 2**20
    if system.compiled:
        runner.compile_s = max(first - steady, 0.0)
    return runner


# Timing ----------------------------------------------------------------------------------
@dataclass
class Sample:
    round: int
    rate: float  # calls per second x batch (images/s), or FLOP/s for a ceiling
    others: float  # other processes' CPU use during the sample, in cores
    contended: bool


def time_calls(fn: Callable[[], object], min_time: float, min_calls: int, clock: str = "wall") -> tuple[float, float, int]:
    """Call `fn` at least `min_calls` times and for at least `min_time` s; (seconds per call,
    others' CPU in cores, calls). `clock="cpu"` counts this thread's CPU time instead of
    wall time (see BenchConfig.clock)."""
    timer = time.thread_time if clock == "cpu" else time.perf_counter
    calls = 0
    with CpuMeter() as meter:
        t0, w0 = timer(), time.perf_counter()
        while calls < min_calls or time.perf_counter() - w0 < min_time:
            fn()
            calls += 1
        elapsed = timer() - t0
    return elapsed / calls, meter.others, calls


@dataclass
class Row:
    """The figures of one system on one setting."""

    setting: Setting
    system: System
    samples: list[Sample] = field(default_factory=list)
    ceiling: Optional[float] = None  # FLOP/s of the setting's products in this dtype
    vs_peer: Optional[float] = None  # median within-round ratio to the fastest fp32 eager peer
    vs_timm: Optional[float] = None
    compile_s: float = float("nan")
    work_mib: float = float("nan")
    error: str = ""

    def clean(self) -> list[float]:
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


class _Waiter:
    """Waits for quiet before samples, within a total budget so a busy machine cannot
    stretch a run without bound (its samples are then marked contended instead)."""

    def __init__(self, bench: BenchConfig):
        self.bench, self.left = bench, bench.wait_budget

    def __call__(self) -> None:
        if self.left <= 0:
            return
        t0 = time.perf_counter()
        wait_quiet(self.bench.contended_cores, min(self.bench.max_wait, self.left))
        self.left -= time.perf_counter() - t0


def run_setting(
    setting: Setting,
    systems: Sequence[System],
    bench: BenchConfig,
    log: Callable[[str], None] = lambda s: None,
    waiter: Optional[_Waiter] = None,
) -> list[Row]:
    """Build every system, then time them in `bench.rounds` shuffled rounds with the ceilings."""
    waiter = waiter or _Waiter(bench)
    rows: dict[System, Row] = {}
    runners: dict[System, Runner] = {}
    for system in systems:
        row = rows[system] = Row(setting, system)
        try:
            runner = runners[system] = build_runner(setting, system)
            row.compile_s, row.work_mib = runner.compile_s, runner.work_mib
        except Exception as e:  # a peer that cannot build this setting is reported, not fatal
            row.error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            log(f"  {setting.label} / {system.label}: skipped ({row.error})")
    ceilings: dict[str, tuple[Runner, float]] = {}
    for system in runners:
        p = ceiling_precision(system.precision)
        if p not in ceilings:
            ceilings[p] = ceiling_runner(setting, p)
    ceiling_samples: dict[str, list[Sample]] = {p: [] for p in ceilings}

    rng = random.Random(bench.seed)
    for r in range(bench.rounds):
        order: list[tuple[str, object]] = [("sys", s) for s in runners] + [("gemm", p) for p in ceilings]
        rng.shuffle(order)
        for kind, key in order:
            waiter()
            if kind == "sys":
                sec, others, _ = time_calls(runners[key].fn, bench.min_time, bench.min_calls, bench.clock)
                sample = Sample(r, setting.batch / sec, others, bench.clock == "wall" and others > bench.contended_cores)
                rows[key].samples.append(sample)
            else:
                runner, flops = ceilings[key]
                sec, others, _ = time_calls(runner.fn, bench.min_time / 2, 3, bench.clock)
                ceiling_samples[key].append(Sample(r, flops / sec, others, bench.clock == "wall" and others > bench.contended_cores))
        log(f"  {setting.label}: round {r + 1}/{bench.rounds} done")

    for system, row in rows.items():
        p = ceiling_precision(system.precision)
        if p in ceiling_samples:
            good = [s.rate for s in ceiling_samples[p] if not s.contended] or [s.rate for s in ceiling_samples[p]]
            row.ceiling = statistics.median(good)
    _ratios(list(rows.values()))
    out = list(rows.values())
    for p, samples in ceiling_samples.items():
        row = Row(setting, System("gemm", p), samples)
        out.append(row)
    return out


def _ratios(rows: list[Row]) -> None:
    """Per round: each row's rate over the fastest fp32 eager peer's (and timm's), clean pairs
    only (all pairs if no round has a clean pair); the median over rounds."""
    peers = [r for r in rows if r.system.impl not in ("vitlab", "gemm") and r.system.precision == "fp32"
             and not r.system.compiled and r.samples]
    timm = [r for r in peers if r.system.impl == "timm"]
    for row in rows:
        if not row.samples:
            continue
        row.vs_peer = _median_ratio(row, peers)
        row.vs_timm = _median_ratio(row, timm)


def _median_ratio(row: Row, refs: list[Row]) -> Optional[float]:
    if not refs:
        return None

    def ratios(clean_only: bool) -> list[float]:
        out = []
        for s in row.samples:
            best = [x.rate for ref in refs for x in ref.samples if x.round == s.round and not (clean_only and x.contended)]
            if best and not (clean_only and s.contended) and len(best) == len(refs):
                out.append(s.rate / max(best))
        return out

    values = ratios(True) or ratios(False)
    return statistics.median(values) if values else None


# Suites ----------------------------------------------------------------------------------
def standard_systems(task: str, peers: Iterable[str] = ("timm", "hf", "torchvision"),
                     compiled: Iterable[str] = (), precisions: Iterable[str] = SYSTEM_PRECISIONS) -> list[System]:
    """vitlab at each precision; each peer at fp32 and bf16 autocast (timm also with bf16
    weights); `compiled` lists the precisions at which torch.compile'd vitlab is timed too."""
    precisions = list(precisions)
    if task == "train":
        precisions = [p for p in precisions if p in ("fp32", "bf16-autocast")]
    systems = [System("vitlab", p) for p in precisions]
    for peer in peers:
        systems += [System(peer, p) for p in precisions if p in ("fp32", "bf16-autocast")]
        if peer == "timm" and "bf16" in precisions and task == "infer":
            systems.append(System(peer, "bf16"))
    systems += [System("vitlab", p, compiled=True) for p in compiled]
    return systems


def suite(name: str) -> list[tuple[Setting, list[System]]]:
    """The named suites: "quick" (about 4 minutes on 2 quiet cores) and "full" (about 15)."""
    from vitlab.api import get_config

    def s(model: str, batch: int, task: str = "infer", **overrides) -> Setting:
        return Setting(get_config(model, **overrides), batch, task)

    if name == "quick":
        fast = ["fp32", "fp32-packed", "bf16", "int8"]
        return [
            (s("ViT-Ti/16", 1), standard_systems("infer", ("timm", "torchvision"), precisions=fast)),
            (s("ViT-B/16", 1), standard_systems("infer", ("timm",), precisions=fast)),
            (s("ViT-C/4", 128), standard_systems("infer", ("timm",), precisions=fast)),
            (s("ViT-C/4", 128, "train"), standard_systems("train", ("timm",))),
        ]
    if name == "full":
        out = []
        for model, big in (("ViT-Ti/16", 16), ("ViT-S/16", 16), ("ViT-B/16", 8), ("ViT-C/4", 128)):
            out.append((s(model, 1), standard_systems("infer")))
            out.append((s(model, big), standard_systems("infer", compiled=("fp32",) if model == "ViT-C/4" else ())))
        # torchvision's GELU is always the exact one: the same comparison with every library on it.
        out.append((s("ViT-Ti/16", 1, gelu="exact"), standard_systems("infer", precisions=("fp32", "fp32-packed"))))
        out.append((s("ViT-C/4", 128, "train"), standard_systems("train", compiled=("bf16-autocast",))))
        return out
    raise ValueError(f"unknown suite {name!r}; choose 'quick' or 'full'")


def run(
    plan: Sequence[tuple[Setting, Sequence[System]]],
    bench: BenchConfig = BenchConfig(),
    log: Callable[[str], None] = lambda s: None,
    progress: Optional[Callable[[list[Row]], None]] = None,
) -> list[Row]:
    """Run a plan setting by setting; `progress(rows_so_far)` after each (to save partial results)."""
    if bench.clock not in ("wall", "cpu"):
        raise ValueError(f"clock {bench.clock!r} is not 'wall' or 'cpu'")
    rows: list[Row] = []
    threads = torch.get_num_threads()
    if bench.clock == "cpu":
        torch.set_num_threads(1)
        bench = dataclasses.replace(bench, wait_budget=0.0)  # waiting buys nothing here
    try:
        waiter = _Waiter(bench)
        for setting, systems in plan:
            log(f"{setting.label}: {len(systems)} systems")
            rows += run_setting(setting, systems, bench, log, waiter)
            if progress is not None:
                progress(rows)
    finally:
        torch.set_num_threads(threads)
    return rows


# Reporting -------------------------------------------------------------------------------
COLUMNS = [
    "model", "gelu", "image_size", "batch", "task", "impl", "precision", "compiled",
    "images_per_s", "min", "max", "clean_samples", "samples", "pct_of_ceiling", "ceiling_gflops",
    "x_best_fp32_peer", "x_timm_fp32", "work_mib", "compile_s", "error",
]


def _fmt(v: Optional[float], spec: str) -> str:
    if v is None or v != v:  # None or NaN
        return ""
    return format(v, spec)


def row_dict(row: Row) -> dict[str, str]:
    rates = row.clean()
    is_gemm = row.system.impl == "gemm"
    scale = 1e-9 if is_gemm else 1.0  # ceilings in GFLOP/s
    frac = row.fraction
    return {
        "model": row.setting.config.name,
        "gelu": getattr(row.setting.config, "gelu", ""),  # a BiT ResNet has none
        "image_size": str(row.setting.config.image_size[0]),
        "batch": str(row.setting.batch),
        "task": row.setting.task,
        "impl": row.system.impl,
        "precision": row.system.precision,
        "compiled": "yes" if row.system.compiled else "",
        "images_per_s": _fmt(row.median * scale if rates else None, ".4g"),
        "min": _fmt(min(rates) * scale if rates else None, ".4g"),
        "max": _fmt(max(rates) * scale if rates else None, ".4g"),
        "clean_samples": str(row.n_clean),
        "samples": str(len(row.samples)),
        "pct_of_ceiling": _fmt(100 * frac if frac is not None else None, ".0f"),
        "ceiling_gflops": _fmt(row.ceiling * 1e-9 if row.ceiling else None, ".0f"),
        "x_best_fp32_peer": _fmt(row.vs_peer, ".2f"),
        "x_timm_fp32": _fmt(row.vs_timm, ".2f"),
        "work_mib": _fmt(row.work_mib, ".0f"),
        "compile_s": _fmt(row.compile_s, ".1f"),
        "error": row.error,
    }


def write_csv(rows: Sequence[Row], path: str | os.PathLike) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow(row_dict(row))


def contention_summary(rows: Sequence[Row], threshold: float, word: str = "contended") -> str:
    samples = [s for r in rows for s in r.samples]
    if not samples:
        return "no samples"
    bad = sum(s.others > threshold for s in samples)
    mean_others = statistics.fmean(s.others for s in samples)
    return (f"{bad} of {len(samples)} samples {word} ({bad / len(samples):.0%}); "
            f"other processes used {mean_others:.2f} cores on average during samples")


def markdown(rows: Sequence[Row], info: Optional[dict[str, str]] = None, bench: Optional[BenchConfig] = None) -> str:
    """The results as a Markdown table, headed by the machine, versions and noise."""
    lines = []
    if info:
        lines.append("Measured " + info["date"] + " on " + info["cpu"] + f" ({info['cores']} cores, "
                     f"{info['threads']} threads; {info['isa']}); python {info['python']}, torch {info['torch']}, "
                     f"timm {info['timm']}, transformers {info['transformers']}, torchvision {info['torchvision']}.")
    if bench and bench.clock == "cpu":
        lines.append(f"{bench.rounds} rounds, samples of at least {bench.min_time:g} s. **Single-thread CPU-time "
                     "clock**: one PyTorch thread, each call timed by its own CPU time, so other processes "
                     "cannot inflate it; figures are single-core rates, ceilings too. "
                     + contention_summary(rows, bench.contended_cores, "taken while others were busy") + ".")
    elif bench:
        lines.append(f"{bench.rounds} rounds, samples of at least {bench.min_time:g} s; a sample is contended "
                     f"when other processes used more than {bench.contended_cores:g} cores during it. "
                     + contention_summary(rows, bench.contended_cores) + ".")
    if lines:
        lines.append("")
    lines += [
        "| setting | system | img/s (median) | spread | clean/all | % of ceiling | × best fp32 peer | × timm fp32 | work MiB | compile s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        d = row_dict(row)
        setting = row.setting.label
        if row.error:
            lines.append(f"| {setting} | {row.system.label} | — | skipped: {row.error} | | | | | | |")
            continue
        if row.system.impl == "gemm":
            lines.append(f"| {setting} | matmul ceiling {row.system.precision} | {d['images_per_s']} GFLOP/s | "
                         f"{d['min']}–{d['max']} | {d['clean_samples']}/{d['samples']} | | | | | |")
            continue
        lines.append(
            f"| {setting} | {row.system.label} | {d['images_per_s']} | {d['min']}–{d['max']} | "
            f"{d['clean_samples']}/{d['samples']} | {d['pct_of_ceiling']} | {d['x_best_fp32_peer']} | "
            f"{d['x_timm_fp32']} | {d['work_mib']} | {d['compile_s']} |"
        )
    return "\n".join(lines) + "\n"


def write_results(rows: Sequence[Row], out_dir: str | os.PathLike, name: str, info: dict[str, str],
                  bench: BenchConfig) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / f"{name}.csv", out / f"{name}.md"
    write_csv(rows, csv_path)
    md_path.write_text(f"# Benchmark: {name}\n\n" + markdown(rows, info, bench))
    return csv_path, md_path
