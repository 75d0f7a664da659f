"""Where the time goes: each aten operator's CPU time, by kind, and the Python overhead.

torch.profiler times operators by the wall clock, so on a shared machine a descheduled thread
makes any operator look slow. This profiler times every operator by the CPU time of the
thread that runs it (`time.thread_time_ns`, which other processes cannot inflate), through a
dispatch mode that sees each operator after autograd: forward and backward, eager and
inference mode. With one PyTorch thread (`torch.set_num_threads(1)`) that is all the work;
what the call took beyond the operators is Python and dispatch overhead.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Callable

from torch.utils._python_dispatch import TorchDispatchMode

from vitlab.tables import markdown_table

# Operator name -> the kind of work it is in a ViT.
# Operator name -> the kind of work it is in a ViT. Under inference mode the timer sees
# composite operators whole (`linear`, `matmul`, `softmax`); with autograd, what they
# decompose into (`addmm`, `bmm`, `_softmax`). ViT code calls `matmul` only in attention.
KINDS = {
    "Dense (matrix products)": {"_linear_pointwise", "qlinear_pointwise", "addmm", "mm", "linear", "_int_mm"},
    "attention products": {"bmm", "baddbmm", "matmul"},
    "fused attention": {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu_backward",
                        "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward"},
    "softmax": {"softmax", "_softmax", "_softmax_backward_data"},
    "LayerNorm": {"layer_norm", "native_layer_norm", "native_layer_norm_backward"},
    "GELU": {"gelu", "gelu_backward"},
    "copies and reorders": {"copy_", "clone", "_to_copy", "to", "contiguous", "reshape", "_reorder_linear_weight", "cat"},
    "optimizer": {"_fused_adamw_", "_fused_adam_", "_foreach_add_", "_foreach_mul_", "_foreach_addcmul_",
                  "_foreach_addcdiv_", "_foreach_lerp_", "_foreach_sqrt", "_foreach_div_", "_foreach_maximum_",
                  "_foreach_add", "_foreach_mul", "_foreach_div", "_foreach_sqrt_", "_foreach_addcdiv",
                  "_foreach_neg", "_foreach_pow", "_foreach_sub", "_foreach_reciprocal_"},
}
OVERHEAD = "Python and dispatch overhead"
KIND_OF = {op: kind for kind, ops in KINDS.items() for op in ops}


def kind_of(op: str) -> str:
    return KIND_OF.get(op, "other elementwise and reductions")


class _OpTimer(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ns: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.thread_time_ns()
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.ns[name] += time.thread_time_ns() - t0
        self.calls[name] += 1
        return out


@dataclass
class Profile:
    """CPU seconds per call of the profiled function: in total, per operator, per kind."""

    seconds: float
    by_op: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    @property
    def by_kind(self) -> dict[str, float]:
        kinds: collections.Counter = collections.Counter()
        for op, s in self.by_op.items():
            kinds[kind_of(op)] += s
        kinds[OVERHEAD] = max(self.seconds - sum(self.by_op.values()), 0.0)
        return dict(kinds.most_common())

    @property
    def timed(self) -> float:
        """The seconds shares are taken of: the plain total, or the operators' sum if that is
        larger (a slower minute during the timed calls)."""
        return max(self.seconds, sum(self.by_op.values()))

    def shares(self) -> dict[str, float]:
        """Each kind's fraction of the call's time."""
        return {k: s / self.timed for k, s in self.by_kind.items()}


def profile(fn: Callable[[], object], calls: int = 3, warmup: int = 2) -> Profile:
    """Per-call CPU seconds of `fn`: the total from `calls` plain calls, the operators from
    `calls` more under the operator timer (after `warmup` calls, which also pay for the
    timer's set-up). The overhead line is the total minus the operators, so the timer's own
    cost (microseconds per operator) does not count as the model's. Run with one thread.
    """
    for _ in range(warmup):
        fn()
    t0 = time.thread_time_ns()
    for _ in range(calls):
        fn()
    total = (time.thread_time_ns() - t0) / 1e9 / calls
    timer = _OpTimer()
    with timer:
        fn()
    timer = _OpTimer()
    with timer:
        for _ in range(calls):
            fn()
    return Profile(total, {op: ns / 1e9 / calls for op, ns in timer.ns.items()},
                   {op: n // calls for op, n in timer.calls.items()})


def table(named: dict[str, Profile]) -> str:
    """A Markdown table: one row per kind of work, one column per profile (ms and share)."""
    kinds: list[str] = []
    for p in named.values():
        kinds += [k for k in p.by_kind if k not in kinds]
    rows = []
    for kind in kinds:
        cells = []
        for p in named.values():
            s = p.by_kind.get(kind, 0.0)
            cells.append(f"{s * 1e3:.2f} ms ({s / p.timed:.0%})" if s else "")
        rows.append([kind, *cells])
    rows.append(["total per call", *(f"{p.seconds * 1e3:.1f} ms" for p in named.values())])
    return markdown_table(["where the time goes", *named], rows)
