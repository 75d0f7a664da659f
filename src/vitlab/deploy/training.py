"""The training step's CPU kernels (issue 51): what the step's wrapper runs, so that the model
keeps its public ops (`F.linear`) and the speed lives outside it.

- **fp32 Dense products on oneDNN where they measured faster.** PyTorch multiplies fp32 on MKL,
  which on an AMD Zen 4 runs its AVX2 code: oneDNN's AVX-512 kernels computed the forward
  product and the input gradient 15-30% faster there at ViT-S/16's training shapes, and MKL
  the weight gradient (K = the batch's tokens). So, per Dense shape, the forward x W^T + b and
  the input gradient dY W run on whichever of MKL (`F.linear`) and oneDNN timed faster on this
  machine at the model's shapes (`vitlab.deploy.kernels`, cached per machine, forced with
  $VITLAB_DENSE_KERNEL); the weight and bias gradients stay on MKL. `dense_kernels(model)` is a
  context manager for the step's forward; without autocast only (bf16 already runs on oneDNN).
- **The fused Adam/AdamW kernel** (`fused_optimizer`): one pass per tensor instead of PyTorch's
  default on the CPU, the per-parameter loop of five or six operators per tensor.

Both are deterministic at a fixed thread count, so exact resume holds; their numbers differ from
the plain path's by float rounding (another summation order), as another thread count's do.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Hashable, Iterable, Optional

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


def _onednn(x: Tensor, w: Tensor, bias: Optional[Tensor]) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    """x W^T + b with the forward and the input gradient on oneDNN, the weight's on MKL."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn(x.reshape(-1, x.shape[-1]), weight, bias).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Any:
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _onednn(g, weight.t(), None).reshape(x.shape)  # dY W: W^T as a (in, out) weight
        if ctx.needs_input_grad[1]:
            dw = g.t().mm(x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g.sum(0)
        return dx, dw, db


class _DenseMode(TorchFunctionMode):
    """Sends `F.linear` of the chosen (in, out) shapes in fp32 on the CPU to `_OneDnnLinear`."""

    def __init__(self, shapes: frozenset[tuple[int, int]]):
        super().__init__()
        self.shapes = shapes

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and len(args) >= 2:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if (w.dim() == 2 and (w.shape[1], w.shape[0]) in self.shapes and x.dtype == w.dtype == torch.float32
                    and x.device.type == "cpu" and not torch.is_autocast_enabled("cpu")):
                return _OneDnnLinear.apply(x, w, bias)
        return func(*args, **kwargs)


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


def dense_kernels(shapes: Iterable[Iterable[int]]) -> contextlib.AbstractContextManager:
    """A context manager for the training step's forward: fp32 `F.linear` of these (in, out)
    shapes on oneDNN (`chosen_shapes`); a no-op for none."""
    chosen = frozenset((int(k), int(n)) for k, n in shapes)
    return _DenseMode(chosen) if chosen else contextlib.nullcontext()
