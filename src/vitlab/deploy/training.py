"""The training step's CPU kernels (issue 51): what the step's wrapper runs, so that the model
keeps its public ops (`F.linear`) and the speed lives outside it.

- **fp32 Dense products on oneDNN where they measured faster.** PyTorch multiplies fp32 on MKL,
  which on an AMD Zen 4 runs its AVX2 code: oneDNN's AVX-512 kernels computed the forward
  product and the input gradient 15-30% faster there at ViT-S/16's training shapes, and MKL
  the weight gradient (K = the batch's tokens). So, per Dense shape, the forward x W^T + b and
  the input gradient dY W run on whichever of MKL (`F.linear`) and oneDNN timed faster on this
  machine at the model's shapes (`vitlab.deploy.kernels`, cached per machine, forced with
  $VITLAB_DENSE_KERNEL); the weight and bias gradients stay on MKL. `dense_kernels(model)` is a
  context manager for the step's forward.
- **The forward products on packed weights** (`dense_kernels`' `packed`): oneDNN multiplies
  fastest with the weight reordered into its blocked layout (what the ceiling measures). Under
  bf16 autocast, F.linear runs addmm on the plain layout; reordering each bf16 weight once per
  forward call and multiplying with `_linear_pointwise` computed ViT-S/16 b32's forward products
  5-20% faster on Zen 4 (the same bits there), the step 1.08x; the fp32 products on oneDNN
  reorder theirs too (4-6%). The gradients stay as they were. Products of at least
  `PACKED_MIN_ROWS` rows, models past `PACKED_MIN_ELEMENTS`; $VITLAB_PACKED_DENSE=0 turns it off.
- **The fused Adam/AdamW kernel** (`fused_optimizer`): one pass per tensor instead of PyTorch's
  default on the CPU, the per-parameter loop of five or six operators per tensor.
- **Freed activations reused, not returned to the system** (`kept_heap`): glibc serves every
  allocation over 32 MiB (a ViT-B/16 b32 MLP activation is 77 MiB) with its own mmap and gives it
  back at free, so each such tensor of every forward and backward paid a page fault per 4 KiB
  (260,000 a step at ViT-S/16 b32 fp32, 0.4-1.3 s of system time in a 10 s step). Under
  `kept_heap` the training loop's tensors come from the heap, and a freed one is reused.
- **The tanh GELU in one compiled pass** (`fast_gelu`): PyTorch's CPU kernel for
  `F.gelu(approximate="tanh")` (the GELU of the ViT configs) computes tanh with SLEEF's
  1-ulp routine, 1.7-1.9 ns an element forward and as much backward on Zen 4: 2.5x the same
  function written as y sigmoid(y (a + b y^2)) and compiled by inductor into one vectorised
  pass (ViT-S/16 b32 step: 1.06x in bf16, 1.01x in fp32). Large activations only
  (`GELU_MIN_ELEMENTS`), and the eager kernel where inductor cannot compile (no C++ compiler: a
  warning) or $VITLAB_COMPILED_GELU=0. Compiling costs once per machine (inductor's disk cache).

All are deterministic at a fixed thread count, so exact resume holds (a checkpoint records the
kernels, packing and GELU it ran with); the products' and the GELU's numbers differ from the plain
path's by float rounding, as another thread count's do (the kept heap changes none). Measured: benchmarks/results/training-step-zen4*.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import warnings
from typing import Any, Callable, Hashable, Iterable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from vitlab.deploy import kernels, onednn

TRAIN_IMAGES = 8  # images per timed product: a training batch's shape at a few seconds of timing


def training_attention(precision: str) -> str:
    """The CPU attention kernel a training step's model is built with (its `cpu_attention`). In
    bf16, two batched matrix products around a softmax beat the fused kernel on AVX-512 without
    AMX: 2x forward at ViT-B/16's shapes, 2-5x backward (torch 2.14; with AMX the fused forward is
    the faster one, 2.2x at b8). In fp32 the fused kernel is the faster one."""
    return "explicit" if precision in ("bf16", "bf16-autocast") else "fused"


def fused_optimizer(params: Iterable[Tensor]) -> bool:
    """Whether torch's fused Adam/AdamW kernel can take these parameters: plain floating-point
    tensors on the CPU or a CUDA GPU (not FSDP's sharded DTensors, which keep torch's default)."""
    params = list(params)
    return bool(params) and all(type(p) in (Tensor, nn.Parameter) and p.is_floating_point()
                                and p.device.type in ("cpu", "cuda") for p in params)


# glibc's mallopt parameters (malloc.h) and the values its dynamic rule reaches in a process that
# has freed a tensor of 32 MiB or more (mallopt turns that rule off: kept_heap puts them back)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
_GLIBC_AFTER = ((_M_MMAP_MAX, 65536), (_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 64 << 20))


def _glibc() -> Optional[ctypes.CDLL]:
    """This process's C library if it is glibc (whose mallopt kept_heap sets), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only: musl has mallopt as a no-op stub)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def kept_heap(enabled: bool = True, release: bool = True) -> Iterator[None]:
    """Inside: glibc allocates every block from its heap (no mmap) and keeps freed memory (no
    trim), so the training steps' large tensors reuse pages already touched instead of faulting
    in fresh ones. On the way out glibc's usual settings come back and, with `release`, the
    heap's free memory goes back to the system (`release_heap`; the benchmark's step leaves it
    to glibc's usual trimming). A no-op when not `enabled` (a GPU run) or off glibc. The numbers
    do not change: the allocator still aligns every tensor to 64 bytes."""
    libc = _glibc() if enabled else None
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_MAX, 0)
    libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
    try:
        yield
    finally:
        for param, value in _GLIBC_AFTER:
            libc.mallopt(param, value)
        if release:
            release_heap()


def release_heap() -> None:
    """Give glibc's free heap memory back to the system (malloc_trim); a no-op off glibc."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


GELU_MIN_ELEMENTS = 1 << 20  # smaller activations keep the eager kernel (a tiny model: no compile at all)
_GELU_A, _GELU_B = 1.5957691216057308, 0.07135481627260025  # 2 sqrt(2/pi) and 2 sqrt(2/pi) 0.044715


def _gelu_tanh(y: Tensor) -> Tensor:
    """0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3))), written as y sigmoid(2 sqrt(2/pi) (...))."""
    z = y.float()
    return (z * torch.sigmoid(z * (_GELU_A + _GELU_B * z * z))).to(y.dtype)


def _gelu_tanh_backward(grad: Tensor, y: Tensor) -> Tensor:
    """d/dy of `_gelu_tanh` times grad: s + y s (1 - s) (a + 3 b y^2), s the sigmoid above."""
    z = y.float()
    s = torch.sigmoid(z * (_GELU_A + _GELU_B * z * z))
    return (grad.float() * (s + z * s * (1 - s) * (_GELU_A + 3 * _GELU_B * z * z))).to(y.dtype)


@functools.cache
def _compiled(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    return torch.compile(fn, dynamic=True)  # one kernel for every size (inputs are flattened)


_EAGER_GELU: list[str] = []  # why inductor could not compile the GELU in this process, once it failed


def _gelu_call(fn: Callable[..., Tensor], *args: Tensor) -> Optional[Tensor]:
    """fn compiled on the flattened args, reshaped back; None where inductor failed."""
    if _EAGER_GELU:
        return None
    try:
        with torch._C.DisableTorchFunction():  # the step's modes are not part of the kernel
            return _compiled(fn)(*(a.reshape(-1) for a in args)).view(args[-1].shape)
    except Exception as e:  # no C++ compiler, an inductor bug: the eager kernel, said once
        _EAGER_GELU.append(f"{type(e).__name__}: {e}".splitlines()[0][:200])
        warnings.warn(f"the compiled GELU failed ({_EAGER_GELU[0]}); PyTorch's eager kernel is used", stacklevel=2)
        return None


class _GeluTanh(torch.autograd.Function):
    """F.gelu(y, approximate="tanh") forward and backward, each one compiled pass; y is saved."""

    @staticmethod
    def forward(ctx: Any, y: Tensor) -> Tensor:
        ctx.save_for_backward(y)
        out = _gelu_call(_gelu_tanh, y)
        return F.gelu(y, approximate="tanh") if out is None else out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        out = _gelu_call(_gelu_tanh_backward, grad.contiguous(), y)
        return torch.ops.aten.gelu_backward(grad, y, approximate="tanh") if out is None else out


class _GeluMode(TorchFunctionMode):
    """Sends large tanh `F.gelu` calls on the CPU to `_GeluTanh`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.gelu and args and kwargs.get("approximate", args[1] if len(args) > 1 else "none") == "tanh":
            y = args[0]
            if (y.device.type == "cpu" and y.numel() >= GELU_MIN_ELEMENTS and y.is_contiguous() and not _EAGER_GELU
                    and y.dtype in (torch.float32, torch.bfloat16)):
                return _GeluTanh.apply(y)
        return func(*args, **kwargs)


def gelu_elements(model: torch.nn.Module, batch: int) -> int:
    """The size of a step's largest tanh GELU activation (batch x tokens x MLP width); 0 for a
    model without one (the exact GELU, a ResNet)."""
    cfg: Any = getattr(model, "config", None)
    return batch * cfg.num_tokens * cfg.mlp_dim if getattr(cfg, "gelu", None) == "tanh" else 0


def gelu_for_run(saved_meta: Optional[dict], eager_cpu: bool, elements: int) -> bool:
    """Whether a training run computes the tanh GELU compiled: a resumed run as it did (eager for
    a checkpoint from before the compiled GELU: exact resume), else an eager (not torch.compile'd)
    run on the CPU whose GELU activations reach `GELU_MIN_ELEMENTS` (`gelu_elements`), unless
    $VITLAB_COMPILED_GELU=0. A smaller model runs without the mode: it would only add its Python
    dispatch to every operator of the step (about 5% of a ViT-Ti step at 16 px)."""
    if saved_meta is not None:
        return bool(saved_meta.get("compiled_gelu", False))
    return eager_cpu and elements >= GELU_MIN_ELEMENTS and os.environ.get("VITLAB_COMPILED_GELU", "1") != "0"


def fast_gelu(enabled: bool = True) -> contextlib.AbstractContextManager:
    """A context manager for the training step (forward and backward): the tanh GELU compiled
    (see the module's notes); a no-op when not `enabled` (`gelu_for_run`)."""
    return _GeluMode() if enabled else contextlib.nullcontext()


PACKED_MIN_ELEMENTS = 1 << 20  # a smaller model's step keeps the products it had (no mode on every operator)
PACKED_MIN_ROWS = 256  # fewer rows (the head's, one per image) are not packed for: the reorder would cost more


def _onednn(x: Tensor, w: Tensor, bias: Optional[Tensor], packed: bool = False) -> Tensor:
    """x W^T + b on oneDNN; `packed`: W first reordered into oneDNN's blocked layout for x's rows
    (the ceiling's kernel; one reorder of W per call)."""
    if packed:
        w = torch.ops.mkldnn._reorder_linear_weight(w, x.shape[0])
    return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    """x W^T + b with the forward on oneDNN (`packed`: on W reordered), the input gradient on
    oneDNN too (`onednn_dx`) or as autograd computes it for F.linear (dY W, the bf16 path: only
    the forward's kernel changes), the weight's on MKL."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Optional[Tensor], packed: bool = False,
                onednn_dx: bool = True) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.onednn_dx = bias is not None, onednn_dx
        return _onednn(x.reshape(-1, x.shape[-1]), weight, bias, packed).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Any:
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:  # dY W (on oneDNN: W^T as a (in, out) weight)
            dx = (_onednn(g, weight.t(), None) if ctx.onednn_dx else g.mm(weight)).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            dw = g.t().mm(x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g.sum(0)
        return dx, dw, db, None, None


class _DenseMode(TorchFunctionMode):
    """Sends `F.linear` on the CPU to `_OneDnnLinear`: in fp32 the chosen (in, out) shapes; with
    `packed`, on weights reordered where the input has at least `PACKED_MIN_ROWS` rows, and then
    also every contiguous input's under bf16 autocast (on the bf16 casts autocast makes)."""

    def __init__(self, shapes: frozenset[tuple[int, int]], packed: bool = False):
        super().__init__()
        self.shapes, self.packed = shapes, packed

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and len(args) >= 2:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if w.dim() == 2 and x.dim() >= 1 and x.device.type == "cpu":
                packed = self.packed and x.numel() >= PACKED_MIN_ROWS * x.shape[-1]
                if not torch.is_autocast_enabled("cpu"):
                    if (w.shape[1], w.shape[0]) in self.shapes and x.dtype == w.dtype == torch.float32:
                        return _OneDnnLinear.apply(x, w, bias, packed)
                elif (packed and x.dim() >= 2 and x.is_contiguous() and torch.get_autocast_dtype("cpu") == torch.bfloat16
                      and all(t.dtype in (torch.float32, torch.bfloat16) for t in (x, w, *([] if bias is None else [bias])))):
                    bf16 = torch.bfloat16
                    return _OneDnnLinear.apply(x.to(bf16), w.to(bf16), None if bias is None else bias.to(bf16), True, False)
        return func(*args, **kwargs)


def dense_elements(model: nn.Module, batch: int) -> int:
    """The size of a ViT step's largest Dense activation (batch x tokens x MLP width); 0 for a
    model without encoder blocks."""
    cfg: Any = getattr(model, "config", None)
    return batch * cfg.num_tokens * cfg.mlp_dim if hasattr(cfg, "num_heads") else 0


def packed_for_run(saved_meta: Optional[dict], eager_cpu: bool, elements: int, dtype: torch.dtype) -> bool:
    """Whether a training run's forward products on oneDNN run on packed weights (`dense_kernels`'
    `packed`): a resumed run as it did (unpacked, and bf16 on autocast's own products, for a
    checkpoint from before this choice: exact resume), else an eager run on the CPU with products
    on oneDNN (bf16 autocast, or fp32 with chosen shapes; not compiled, no recomputed blocks, not
    FSDP) whose Dense activations reach `PACKED_MIN_ELEMENTS` (`dense_elements`) on a CPU where
    oneDNN runs `dtype`, unless $VITLAB_PACKED_DENSE=0."""
    if saved_meta is not None:
        return bool(saved_meta.get("packed_dense", False))
    return (eager_cpu and elements >= PACKED_MIN_ELEMENTS and os.environ.get("VITLAB_PACKED_DENSE", "1") != "0"
            and dtype in onednn.onednn_dtypes())


def time_training_dense(k: int, n: int, tokens: int) -> dict[str, float]:
    """ms per image of a Dense layer's forward product and input gradient in fp32 (in k, out n,
    `tokens` rows per image, `TRAIN_IMAGES` images) on MKL (`F.linear`) and on oneDNN."""
    gen = torch.Generator().manual_seed(0)
    w, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    x, g = torch.randn(TRAIN_IMAGES * tokens, k, generator=gen), torch.randn(TRAIN_IMAGES * tokens, n, generator=gen)
    calls: dict[Hashable, Any] = {
        ("F.linear", "forward"): functools.partial(F.linear, x, w, bias),
        ("F.linear", "input gradient"): functools.partial(torch.mm, g, w),
        ("oneDNN", "forward"): functools.partial(_onednn, x, w, bias),
        ("oneDNN", "input gradient"): functools.partial(_onednn, g, w.t(), None),
    }
    s = kernels.best_times(calls)
    return {kernel: 1e3 * (s[kernel, "forward"] + s[kernel, "input gradient"]) / TRAIN_IMAGES
            for kernel in kernels.DENSE}


def choose(k: int, n: int, tokens: int) -> kernels.Choice:
    """The kernel of the fp32 training products of a Dense layer of this shape: forced, cached
    or measured (the model's own `F.linear` unless oneDNN is more than `kernels.MARGIN` faster)."""
    what = f"training Dense float32 {k}x{n}, {tokens} tokens (forward + input gradient)"
    return kernels.choose_kernel("dense", what, "F.linear", lambda: time_training_dense(k, n, tokens))


def plan(model: nn.Module) -> list[tuple[int, int, kernels.Choice]]:
    """(in, out, choice) for a ViT's encoder Dense shapes (none for a model without encoder
    blocks, or where oneDNN has no fp32 kernel)."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "num_heads") or torch.float32 not in onednn.onednn_dtypes():
        return []
    return [(k, n, choose(k, n, cfg.num_tokens)) for _, k, n, _ in kernels.dense_shapes(cfg)]


def chosen_shapes(model: nn.Module) -> list[list[int]]:
    """The (in, out) Dense shapes whose fp32 training products run on oneDNN on this machine,
    sorted: what a run keeps in its checkpoints, so that a resumed run multiplies as it did."""
    return sorted([k, n] for k, n, c in plan(model) if c.kernel == "oneDNN")


def shapes_for_run(model: nn.Module, saved_meta: Optional[dict], eager_fp32: bool) -> list[list[int]]:
    """The shapes a training run multiplies on oneDNN: a resumed run's own (none for a checkpoint
    from before this choice: exact resume), else those chosen on this machine for an eager fp32
    run on the CPU; none under autocast (bf16 runs on oneDNN already), for compiled steps and
    for recomputed blocks (the recomputation would multiply on the model's own kernel)."""
    if saved_meta is not None:
        return [[int(k), int(n)] for k, n in saved_meta.get("dense_kernels", [])]
    return chosen_shapes(model) if eager_fp32 else []


def dense_kernels(shapes: Iterable[Iterable[int]], packed: bool = False) -> contextlib.AbstractContextManager:
    """A context manager for the training step's forward: fp32 `F.linear` of these (in, out)
    shapes on oneDNN (`chosen_shapes`), and with `packed` (`packed_for_run`) the forward products
    on packed weights, bf16 autocast's too; a no-op for no shapes and not `packed`."""
    chosen = frozenset((int(k), int(n)) for k, n in shapes)
    return _DenseMode(chosen, packed) if chosen or packed else contextlib.nullcontext()
