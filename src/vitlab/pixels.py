"""uint8 pixels to a model's input: the one normaliser.

    y = (x / 255 - mean) / std, per channel, in float32

computed in the order torchvision's ToTensor and Normalize compute it (divide, subtract,
divide), so that every path gives the same bits: the evaluation transform, the training
transform (on PIL's pixels or the fast path's), the training process normalising uint8
batches on its device, and a model given uint8 pixels. A float tensor is taken as already
in [0, 1]. Channels-last input comes out in the standard layout.
"""

from __future__ import annotations

from typing import Sequence

import torch


def normalise(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """(..., C, H, W) uint8 (or float in [0, 1]) -> float32 normalised, on x's device."""
    y = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    if x.dtype == torch.uint8:
        y.div_(255)
    shape = (-1, 1, 1)
    m = torch.as_tensor(mean, dtype=torch.float32, device=y.device).view(shape)
    s = torch.as_tensor(std, dtype=torch.float32, device=y.device).view(shape)
    return y.sub_(m).div_(s)


def unnormalise(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """A model's (B, C, H, W) input back to pixels in [0, 1], in its dtype: undo (pixel - mean) / std."""
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x * s + m).clamp(0.0, 1.0)


class Normalise:
    """`normalise` with a model's mean and std, as a picklable callable (data-loader workers)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return normalise(x, self.mean, self.std)

    def __repr__(self) -> str:
        numbers = lambda v: "(" + ", ".join(f"{x:g}" for x in v) + ")"  # noqa: E731
        return f"Normalise((pixel / 255 - mean) / std, mean {numbers(self.mean)}, std {numbers(self.std)})"
