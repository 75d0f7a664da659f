"""Which kernel runs each Dense shape and the attention of a CPU inference copy: chosen by
timing on this machine when a copy is built, and remembered per machine.

Which library multiplies fastest depends on the CPU, not on a rule: on a Zen 4 (AVX-512)
oneDNN's packed fp32 product beats MKL's `F.linear` by 10-20%; on an AVX2-only Zen 3 it lost
(issue 51: the packed copy ran at 0.86x the fastest peer, the plain model at 1.04x); the fused
attention kernel wins in bf16 with AMX and loses without it. So the copy times the kernels it
has at the model's own shapes (`time_dense`, `time_attention`: rows of one image and of four,
interleaved, the best of a few calls; on one thread by its own CPU time, which other processes
cannot inflate) and takes the faster (`decide`: the model's own kernel
unless another beats it by more than `MARGIN`). The timings are cached in
$VITLAB_CACHE/kernels.json (default $XDG_CACHE_HOME/vitlab, else ~/.cache/vitlab) under a key
of the CPU model, its instruction-set flags, the thread count, the torch version and the ISA
caps in force: another machine, a changed thread count or a new torch measures again. A cache
that cannot be read is measured over and rewritten; one that cannot be written is left alone.

The fp32 training step chooses its Dense products the same way (`vitlab.deploy.training`).
$VITLAB_DENSE_KERNEL (oneDNN or F.linear) and $VITLAB_ATTENTION_KERNEL (fused or explicit)
force a choice, for tests and for comparing paths. `choices()` lists what this process chose
and why (`vitlab bench` writes it under its table; `vitlab info --kernels` prints it for a
checkpoint). Both kernels of a kind compute the same function: the copy's logits stay within
float rounding of the plain model whichever is chosen.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Hashable, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from vitlab.config import ConfigError, ViTConfig
from vitlab.config.device import cpu_name_and_flags
from vitlab.deploy import onednn
from vitlab.files import atomic_write_text, cache_dir, read_json

DENSE = ("oneDNN", "F.linear")  # packed weights, bias and activation fused / the model's own F.linear
ATTENTION = ("fused", "explicit")  # F.scaled_dot_product_attention / matmul, softmax, matmul
FORCE = {"dense": "VITLAB_DENSE_KERNEL", "attention": "VITLAB_ATTENTION_KERNEL"}
MARGIN = 0.03  # another kernel must beat the model's own by this much: noise never flips to a loser
BATCHES = (1, 4)  # images per timed call; the cost is the mean time per image over both
REPEATS = 3  # rounds at least; small shapes repeat until SECONDS have passed (at most MAX_REPEATS)
SECONDS, MAX_REPEATS = 0.25, 50
CACHE_VERSION = 1
GELU = {None: None, "gelu": "none", "gelu_tanh": "tanh"}  # an activation's name -> F.gelu's approximate


@dataclass
class Choice:
    """One decision: the kernel for a shape, the time per image of each candidate, and where
    the decision came from ("measured", "cached", or the variable that forced it)."""

    what: str
    kernel: str
    ms: dict[str, float] = field(default_factory=dict)
    source: str = "measured"

    @property
    def why(self) -> str:
        times = ", ".join(f"{k} {v:.3g}" for k, v in sorted(self.ms.items(), key=lambda kv: kv[1]))
        return f"{self.source}; " + (f"ms per image: {times}" if times else "no timing")

    def __str__(self) -> str:
        return f"{self.what}: {self.kernel} ({self.why})"


def decide(ms: Mapping[str, float], baseline: str, margin: float = MARGIN) -> str:
    """The kernel to run, from the time each candidate took (any unit): the fastest, unless
    `baseline` (the model's own kernel, which computes its numbers exactly) is within `margin`
    of it. Infinite or NaN times (a kernel that failed) never win."""
    usable = {k: v for k, v in ms.items() if math.isfinite(v)}
    if not usable:
        return baseline
    fastest = min(usable, key=lambda k: usable[k])
    if baseline in usable and usable[baseline] <= usable[fastest] * (1 + margin):
        return baseline
    return fastest


def forced(kind: str) -> Optional[str]:
    """The kernel $VITLAB_DENSE_KERNEL or $VITLAB_ATTENTION_KERNEL names (kind "dense" or
    "attention"), or None when unset or "auto"."""
    name = FORCE[kind]
    value = os.environ.get(name, "").strip()
    if value in ("", "auto"):
        return None
    known = DENSE if kind == "dense" else ATTENTION
    if value not in known:
        raise ConfigError(f"${name}={value}: not a {kind} kernel; use {', '.join(known)} or auto (measure)")
    return value


# The machine and the cache --------------------------------------------------------------------


def machine() -> dict[str, object]:
    """What a timing depends on: the CPU, its vector flags, the threads, torch, the ISA caps."""
    cpu, flags = cpu_name_and_flags()
    vector = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse4", "sve", "asimd")))
    return {
        "cpu": cpu,
        "arch": platform.machine(),
        "isa": " ".join(vector),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "aten": torch.backends.cpu.get_cpu_capability(),
        "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
    }


def machine_key(info: Optional[Mapping[str, object]] = None) -> str:
    text = json.dumps(dict(info or machine()), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_path() -> Path:
    return cache_dir() / "kernels.json"


# The cache's shape (files.documents checks it): per machine key, what the key was made of and
# the timings, ms per kernel, of each `what`.
CACHE_SHAPE = {"version": int, "machines": {str: {"machine": dict, "timings": {str: {str: float}}}}}


def read_cache(path) -> dict:
    """The cache file's contents, or an empty cache if it is missing, unreadable or not one."""
    try:
        data = read_json(path, CACHE_SHAPE, "kernel timing cache")
    except (OSError, ValueError):
        data = None
    return data if data and data["version"] == CACHE_VERSION else {"version": CACHE_VERSION, "machines": {}}


def cached(path, key: str, what: str) -> Optional[dict[str, float]]:
    """The timings stored for `what` on the machine `key`, or None."""
    ms = read_cache(path)["machines"].get(key, {}).get("timings", {}).get(what)
    return {k: float(v) for k, v in ms.items()} if ms else None


def store(path, key: str, info: Mapping[str, object], what: str, ms: Mapping[str, float]) -> None:
    """Add timings to the cache, atomically; a cache that cannot be written is left alone."""
    data = read_cache(path)
    data["machines"].setdefault(key, {"machine": dict(info), "timings": {}})["timings"][what] = dict(ms)
    try:
        atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass


# Timing ----------------------------------------------------------------------------------------


def _clock() -> Callable[[], float]:
    # One thread: its own CPU time, which other processes cannot inflate. More: wall time (the
    # process's CPU time would count the idle OpenMP threads' spinning, which swamps small
    # products); the best of interleaved calls keeps a busy moment out.
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def best_times(calls: Mapping[Hashable, Callable[[], object]], repeats: int = REPEATS) -> dict[Hashable, float]:
    """The best time of each call in seconds, the calls interleaved so that a busy moment of the
    machine slows them all, over `repeats` rounds or more for quick calls (until `SECONDS` of
    wall time, at most `MAX_REPEATS`): the best of many is what a quiet moment gives. A call
    that raises gets an infinite time."""
    clock = _clock()
    best = {name: math.inf for name in calls}
    live = {}
    with torch.inference_mode():
        for name, fn in calls.items():
            try:
                fn()
                live[name] = fn
            except RuntimeError:
                pass
        start = time.perf_counter()
        for done in range(1, MAX_REPEATS + 1):
            for name, fn in live.items():
                t0 = clock()
                fn()
                best[name] = min(best[name], clock() - t0)
            if done >= repeats and time.perf_counter() - start >= SECONDS:
                break
    return best


def per_image(seconds: Mapping[Hashable, float], kernels: tuple[str, ...]) -> dict[str, float]:
    """ms per image of each kernel from the seconds of each (kernel, batch), averaged over
    the timed batch sizes."""
    return {k: 1e3 * sum(seconds[k, b] / b for b in BATCHES) / len(BATCHES) for k in kernels}


def _dense_plain(x: Tensor, w: Tensor, bias: Tensor, approximate: Optional[str]) -> Tensor:
    y = F.linear(x, w, bias)
    return y if approximate is None else F.gelu(y, approximate=approximate)


def _explicit_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    return ((q * scale) @ k.transpose(-2, -1)).softmax(-1) @ v


def time_dense(k: int, n: int, tokens: int, activation: Optional[str], dtype: torch.dtype) -> dict[str, float]:
    """ms per image of a Dense layer (in k, out n, `tokens` rows per image, then the activation:
    None, "gelu" or "gelu_tanh") on each kernel of `DENSE` this CPU runs in `dtype`."""
    gen = torch.Generator().manual_seed(0)
    w, bias = torch.randn(n, k, generator=gen).to(dtype), torch.randn(n, generator=gen).to(dtype)
    approximate = GELU[activation]
    post = ("none", "") if activation is None else ("gelu", approximate or "none")
    kernels = DENSE if dtype in onednn.onednn_dtypes() else ("F.linear",)
    calls: dict[Hashable, Callable[[], object]] = {}
    for b in BATCHES:
        x = torch.randn(b * tokens, k, generator=gen).to(dtype)
        calls["F.linear", b] = functools.partial(_dense_plain, x, w, bias, approximate)
        if "oneDNN" in kernels:
            packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
            calls["oneDNN", b] = functools.partial(torch.ops.mkldnn._linear_pointwise, x, packed, bias, post[0], [], post[1])
    return per_image(best_times(calls), kernels)


def time_attention(heads: int, tokens: int, head_dim: int, dtype: torch.dtype) -> dict[str, float]:
    """ms per image of attention at the model's shapes on each kernel of `ATTENTION`."""
    gen = torch.Generator().manual_seed(0)
    calls: dict[Hashable, Callable[[], object]] = {}
    for b in BATCHES:
        q, k, v = (torch.randn(b, heads, tokens, head_dim, generator=gen).to(dtype) for _ in range(3))
        calls["fused", b] = functools.partial(F.scaled_dot_product_attention, q, k, v)
        calls["explicit", b] = functools.partial(_explicit_attention, q, k, v, head_dim**-0.5)
    return per_image(best_times(calls), ATTENTION)


# The decisions -----------------------------------------------------------------------------------

_MADE: dict[tuple[str, str], Choice] = {}  # what this process chose, by machine key and `what`


def choices() -> list[Choice]:
    """The decisions this process made or read, in order (the latest per shape)."""
    return list({c.what: c for c in _MADE.values()}.values())


def choose_kernel(kind: str, what: str, baseline: str, measure: Callable[[], dict[str, float]]) -> Choice:
    """The kernel for `what` (kind "dense" or "attention"): forced by its variable, made earlier
    in this process, cached for this machine, or `measure()`d (ms per kernel) and cached."""
    force = forced(kind)
    if force is not None:
        choice = _MADE["forced", what] = Choice(what, force, {}, f"forced by ${FORCE[kind]}")
        return choice
    info = machine()
    key, path = machine_key(info), cache_path()
    if (key, what) in _MADE:
        return _MADE[key, what]
    onednn.refuse_inside_a_trace("timing the CPU kernels")
    ms = cached(path, key, what)
    source = "cached"
    if ms is None:
        ms, source = measure(), "measured"
        store(path, key, info, what, {k: (v if math.isfinite(v) else 1e30) for k, v in ms.items()})
    choice = _MADE[key, what] = Choice(what, decide(ms, baseline), ms, source)
    return choice


def choose_dense(k: int, n: int, tokens: int, activation: Optional[str], dtype: torch.dtype) -> Choice:
    """The kernel for a Dense layer of this shape in `dtype`: forced, cached or measured."""
    what = f"Dense {str(dtype).removeprefix('torch.')} {k}x{n}{f' +{activation}' if activation else ''}, {tokens} tokens"
    return choose_kernel("dense", what, "F.linear", lambda: time_dense(k, n, tokens, activation, dtype))


def choose_attention(heads: int, tokens: int, head_dim: int, dtype: torch.dtype) -> Choice:
    """The kernel for attention at these shapes; the baseline is the model's own on the CPU
    (`vitlab.models.layers.Attention`: explicit in bf16, else fused)."""
    what = f"attention {str(dtype).removeprefix('torch.')} {heads} heads x {head_dim}, {tokens} tokens"
    return choose_kernel("attention", what, "explicit" if dtype == torch.bfloat16 else "fused",
                         lambda: time_attention(heads, tokens, head_dim, dtype))


def dense_shapes(cfg) -> list[tuple[str, int, int, Optional[str]]]:
    """(layer, in, out, activation) of a ViT block's Dense layers (Eq. 2-3)."""
    d, act = cfg.hidden_size, "gelu_tanh" if cfg.gelu == "tanh" else "gelu"
    return [("qkv", d, 3 * d, None), ("proj", d, d, None), ("fc1", d, cfg.mlp_dim, act), ("fc2", cfg.mlp_dim, d, None)]


def plan(cfg, dtype: torch.dtype = torch.float32) -> list[Choice]:
    """Every decision a copy of a model with config `cfg` in `dtype` takes on this machine."""
    tokens = cfg.num_tokens
    out = [choose_dense(k, n, tokens, act, dtype) for _, k, n, act in dense_shapes(cfg)]
    return out + [choose_attention(cfg.num_heads, tokens, cfg.hidden_size // cfg.num_heads, dtype)]


def describe(cfg: Mapping) -> list[dict]:
    """For `vitlab info --kernels`: the choices of the CPU inference copies of a model with this
    config (a dict, as a checkpoint stores it) on this machine, in fp32 and, where oneDNN runs
    it, bf16; none for a model without encoder blocks (a BiT ResNet runs as it is)."""
    if "num_heads" not in cfg:
        return []
    config = ViTConfig.from_dict(dict(cfg))
    dtypes = [torch.float32] + [torch.bfloat16] * (torch.bfloat16 in onednn.onednn_dtypes())
    return [{"what": c.what, "kernel": c.kernel, "ms_per_image": c.ms, "why": c.why}
            for dtype in dtypes for c in plan(config, dtype)]
