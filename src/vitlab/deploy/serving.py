"""Reduced-precision inference copies of a model, and what they cost in accuracy.

Every function here takes a trained `VisionTransformer` and returns a *copy* prepared for
inference; the original model is never changed. Two reduced-precision modes:

- `to_bfloat16(model)`: weights and activations in bfloat16. On CPUs with AVX512-BF16 or AMX
  the matrix products (over 85% of a ViT's time, paper §3.1 Eq. 2-3 are all Dense layers)
  run 2-5x faster than fp32, and, unlike autocast, the weights are not re-cast on every call.
- `quantize_int8(model)`: the encoder's Dense layers (qkv, attention output, MLP) with int8
  weights (one scale per output channel) and int8 activations (one scale per token, chosen at
  run time), multiplied by `torch._int_mm`. PyTorch's own `quantize_dynamic` is deprecated
  as of torch 2.9+ (it points to torchao), so vitlab carries this small layer instead.

`agreement(reference, candidate, images)` measures what either mode costs in accuracy: the
fraction of images whose top-1 class is unchanged, and the largest logit difference.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vitlab.models.vit import VisionTransformer


class Serving(nn.Module):
    """A model in another dtype behind an fp32 interface: casts the images in, logits out."""

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.model = model
        self.dtype = dtype

    @property
    def config(self):
        return self.model.config

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x.to(self.dtype)).float()


def to_bfloat16(model: VisionTransformer) -> Serving:
    """A bf16 copy of `model` for inference: takes fp32 images, returns fp32 logits."""
    return Serving(copy.deepcopy(model).eval().to(torch.bfloat16), torch.bfloat16)


class Int8Linear(nn.Module):
    """A Dense layer computed in int8: y = (s_x s_w) * (q_x q_w^T) + b.

    Weights are quantised once, symmetric, one scale per output channel; activations are
    quantised per token (row) on every call, so a token with a large outlier does not
    squash the resolution of the others (LayerNorm outputs of ViTs have such outliers).
    The int32 accumulation is exact; the only error is the two roundings to int8.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()  # (out, in)
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # (out,)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # Kept as (out, in); `_int_mm` takes its transposed view without a copy.
        self.register_buffer("weight_int8", q)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()  # (M, in)
        x_scale = x2.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0  # (M, 1)
        xq = torch.round(x2 / x_scale).to(torch.int8)
        acc = torch._int_mm(xq, self.weight_int8.t())  # (M, out), int32, exact
        y = acc.float().mul_(x_scale).mul_(self.weight_scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_int8(model: VisionTransformer) -> VisionTransformer:
    """An inference copy of `model` whose encoder Dense layers run in int8.

    The patch embedding, position embedding, LayerNorms, softmax and the head stay fp32:
    they are a small share of the time and the most sensitive to rounding.
    """
    model = copy.deepcopy(model).eval()
    for block in model.blocks:
        for parent, name in ((block.attn, "qkv"), (block.attn, "proj"), (block.mlp, "fc1"), (block.mlp, "fc2")):
            setattr(parent, name, Int8Linear(getattr(parent, name)))
    return model


@dataclass
class Agreement:
    top1: float  # fraction of images with the same predicted class
    max_abs_diff: float  # largest logit difference
    count: int

    def __str__(self) -> str:
        return f"top-1 agreement {self.top1:.2%} on {self.count} images, max |logit diff| {self.max_abs_diff:.3g}"


@torch.inference_mode()
def agreement(reference: nn.Module, candidate: nn.Module, images: Tensor, batch_size: int = 256) -> Agreement:
    """How often `candidate` predicts the same class as `reference` on `images` (N, C, H, W)."""
    same, diff = 0, 0.0
    for i in range(0, len(images), batch_size):
        x = images[i : i + batch_size]
        ref, out = reference(x).float(), candidate(x).float()
        same += int((ref.argmax(-1) == out.argmax(-1)).sum())
        diff = max(diff, float((ref - out).abs().max()))
    return Agreement(same / max(len(images), 1), diff, len(images))


PRECISIONS = ("fp32", "bf16", "int8")


def for_precision(model: VisionTransformer, precision: str) -> nn.Module:
    """The inference copy of `model` for a precision name ("fp32" returns the model itself)."""
    if precision == "fp32":
        return model.eval()
    if precision == "bf16":
        return to_bfloat16(model)
    if precision == "int8":
        return quantize_int8(model)
    raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
