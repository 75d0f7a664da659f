"""BiT ResNet for hybrid models (paper §3.1): weight-standardised convs, GroupNorm, and the
TensorFlow "SAME" padding of the official code, which is asymmetric on strided layers
(PyTorch's symmetric `padding=k//2` gives visibly different numbers)."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.config import ResNetConfig


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """(before, after) padding for TF "SAME": out = ceil(in / stride)."""
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def pad_same(x: Tensor, kernel: int, stride: int, value: float = 0.0) -> Tensor:
    top, bottom = same_padding(x.shape[-2], kernel, stride)
    left, right = same_padding(x.shape[-1], kernel, stride)
    if top or bottom or left or right:
        x = F.pad(x, (left, right, top, bottom), value=value)
    return x


class StdConv2d(nn.Conv2d):
    """Conv whose kernel is standardised per output channel on every forward.

    The stored kernel is raw. mode "std": (w - mean) / (std + eps), the official hybrid's
    form; mode "var": (w - mean) / sqrt(var + eps), the form of timm and of the official BiT
    code. Both use the population variance over (in, kh, kw). `same=True` pads as TF "SAME"
    (the hybrid's official code); `same=False` pads kernel // 2 on every side, as the
    official BiT code does.
    """

    def __init__(
        self, cin: int, cout: int, kernel: int, stride: int = 1, eps: float = 1e-5, mode: str = "std", same: bool = True
    ):
        super().__init__(cin, cout, kernel, stride=stride, padding=0 if same else kernel // 2, bias=False)
        self.eps = eps
        self.mode = mode
        self.same = same

    def standardized_weight(self) -> Tensor:
        w = self.weight
        if self.mode == "var":
            # (w - mean) / sqrt(var + eps) is a batch norm over each output channel's kernel:
            # one fused kernel, which rounds as timm's StdConv2d does.
            flat = w.reshape(1, w.shape[0], -1)
            return F.batch_norm(flat, None, None, training=True, momentum=0.0, eps=self.eps).reshape_as(w)
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        var = w.var(dim=(1, 2, 3), unbiased=False, keepdim=True)
        return (w - mean) / (var.sqrt() + self.eps)

    def forward(self, x: Tensor) -> Tensor:
        if self.same:
            x = pad_same(x, self.kernel_size[0], self.stride[0])
        return F.conv2d(x, self.standardized_weight(), None, self.stride, self.padding)


class Bottleneck(nn.Module):
    """conv1 1x1 -> gn1 -> ReLU -> conv2 3x3 (stride) -> gn2 -> ReLU -> conv3 1x1 -> gn3,
    plus a projected shortcut when the shape changes; ReLU after the sum."""

    def __init__(self, cin: int, mid: int, stride: int, cfg: ResNetConfig):
        super().__init__()
        cout = 4 * mid
        conv = lambda i, o, k, s=1: StdConv2d(i, o, k, s, cfg.ws_eps, cfg.ws_mode)  # noqa: E731
        gn = lambda c: nn.GroupNorm(cfg.gn_groups, c, eps=cfg.gn_eps)  # noqa: E731
        self.conv1, self.gn1 = conv(cin, mid, 1), gn(mid)
        self.conv2, self.gn2 = conv(mid, mid, 3, stride), gn(mid)
        self.conv3, self.gn3 = conv(mid, cout, 1), gn(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(conv(cin, cout, 1, stride), gn(cout))

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.gn1(self.conv1(x)))
        y = F.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return F.relu(shortcut + y)


def bottleneck_stages(cin: int, layers: Sequence[int], widths: Sequence[int],
                      unit: Callable[[int, int, int], nn.Module]) -> list[nn.Sequential]:
    """Stage s of `layers[s]` bottleneck units `unit(cin, mid, stride)` of middle width
    `widths[s]` (4 x it out); the first unit of every stage after the first halves the map,
    and stage 1 keeps the root's /4."""
    stages = []
    for s, (units, mid) in enumerate(zip(layers, widths, strict=True)):
        stages.append(nn.Sequential(*(unit(cin if u == 0 else 4 * mid, mid, 2 if s > 0 and u == 0 else 1) for u in range(units))))
        cin = 4 * mid
    return stages


class ResNetStem(nn.Module):
    """Root (7x7/2 conv, GN, ReLU, 3x3/2 max-pool) and the stages; returns the feature map."""

    def __init__(self, cfg: ResNetConfig, in_channels: int = 3):
        super().__init__()
        width = 64 * cfg.width_factor
        self.root_conv = StdConv2d(in_channels, width, 7, 2, cfg.ws_eps, cfg.ws_mode)
        self.root_gn = nn.GroupNorm(cfg.gn_groups, width, eps=cfg.gn_eps)
        widths = [width * 2**s for s in range(len(cfg.layers))]
        unit = lambda cin, mid, stride: Bottleneck(cin, mid, stride, cfg)  # noqa: E731
        self.stages = nn.Sequential(*bottleneck_stages(width, cfg.layers, widths, unit))
        self.out_channels = cfg.out_channels
        for m in self.modules():
            if isinstance(m, StdConv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.root_gn(self.root_conv(x)))
        x = F.max_pool2d(pad_same(x, 3, 2, value=float("-inf")), 3, 2)
        return self.stages(x)  # (B, C, H/stride, W/stride)
