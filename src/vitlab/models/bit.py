"""The BiT ResNet, the paper's convolutional baseline (§4.1 "BiT ResNets", Kolesnikov et al. 2020).

A pre-activation ResNet-v2 (He et al. 2016, "Identity Mappings") with two changes that make
it train well at any batch size and transfer well: every BatchNorm is a GroupNorm of 32
groups, and every convolution standardises its kernel (weight standardisation). Written in
the order of the official code (google-research/big_transfer):

    root:  7x7/2 conv, zero pad 1, 3x3/2 max-pool                     (B, 64w, H/4, W/4)
    stage s = 1..4, units of
        y = ReLU(GN(x))                         pre-activation, shared by both branches
        shortcut = x, or a 1x1 (stride) projection of y when the shape changes
        y = conv1x1(y) -> ReLU(GN) -> conv3x3 (stride) -> ReLU(GN) -> conv1x1
        x = y + shortcut
    head:  ReLU(GN(x)), global average pool, Dense                  (B, num_classes)

The first unit of stages 2..4 halves the map (its 3x3 carries the stride, as in the official
code and timm; the original ResNet put it on the first 1x1).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.config import BiTConfig
from vitlab.models.inputs import as_image_batch
from vitlab.models.layers import Classifier
from vitlab.models.resnet import StdConv2d, bottleneck_stages


def _conv(cfg: BiTConfig, cin: int, cout: int, kernel: int, stride: int = 1) -> StdConv2d:
    # Symmetric padding (kernel // 2) and (w - mean) / sqrt(var + eps): the official BiT code.
    return StdConv2d(cin, cout, kernel, stride, eps=cfg.ws_eps, mode="var", same=False)


class PreActBottleneck(nn.Module):
    """One residual unit of a stage; `cout` = 4 x `mid`."""

    def __init__(self, cfg: BiTConfig, cin: int, mid: int, stride: int):
        super().__init__()
        cout = 4 * mid
        self.gn1 = nn.GroupNorm(cfg.gn_groups, cin, eps=cfg.gn_eps)
        self.conv1 = _conv(cfg, cin, mid, 1)
        self.gn2 = nn.GroupNorm(cfg.gn_groups, mid, eps=cfg.gn_eps)
        self.conv2 = _conv(cfg, mid, mid, 3, stride)
        self.gn3 = nn.GroupNorm(cfg.gn_groups, mid, eps=cfg.gn_eps)
        self.conv3 = _conv(cfg, mid, cout, 1)
        # The projection reads the pre-activated input, not the raw one (official code).
        self.proj = _conv(cfg, cin, cout, 1, stride) if (stride != 1 or cin != cout) else None

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.gn1(x))  # (B, cin, H, W)
        shortcut = x if self.proj is None else self.proj(y)  # (B, cout, H/s, W/s)
        y = self.conv1(y)
        y = self.conv2(F.relu(self.gn2(y)))  # (B, mid, H/s, W/s)
        y = self.conv3(F.relu(self.gn3(y)))  # (B, cout, H/s, W/s)
        return y + shortcut


class Root(nn.Module):
    """The stem: BiT's 7x7/2 convolution and 3x3/2 max-pool, or one 3x3/1 convolution for 32 px."""

    def __init__(self, cfg: BiTConfig):
        super().__init__()
        self.pool = cfg.stem == "bit"
        self.conv = _conv(cfg, cfg.in_channels, cfg.root_width, 7 if self.pool else 3, 2 if self.pool else 1)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(x)
        if self.pool:
            # A zero pad, then an unpadded pool (official code; a -inf pad gives other numbers,
            # since the root has no activation and its outputs may be negative).
            x = F.max_pool2d(F.pad(x, (1, 1, 1, 1)), 3, 2)
        return x


class BiTResNet(Classifier, nn.Module):
    """A BiT ResNet built from a `BiTConfig`, with the contract of `VisionTransformer`:
    `model(x)` logits (pooled features when `num_classes == 0`), `model(x,
    return_intermediates=True)` a dict of the stem's and each stage's maps and the
    pre-logits, `forward_features` / `forward_head(feats, pre_logits=True)`,
    `reset_classifier(n)`, `.config` and `.class_names`."""

    def __init__(self, config: BiTConfig):
        super().__init__()
        self.config: BiTConfig = config
        self.class_names: Optional[list[str]] = None  # carried into checkpoints
        cfg = config
        self.root = Root(cfg)
        self.stages = nn.ModuleList(bottleneck_stages(cfg.root_width, cfg.layers, cfg.stage_widths,
                                                      functools.partial(PreActBottleneck, cfg)))
        self.norm = nn.GroupNorm(cfg.gn_groups, cfg.feature_dim, eps=cfg.gn_eps)  # the pre-head GN
        for m in self.modules():
            if isinstance(m, StdConv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        self.head: nn.Module = nn.Identity()
        self.reset_classifier(cfg.num_classes)

    def forward_features(self, x: Tensor, record: Optional[dict[str, Any]] = None) -> Tensor:
        """The last stage's map after the pre-head GroupNorm and ReLU, (B, C, H/32, W/32): the
        one loop of every path. `record`: a dict that receives the root's and each stage's maps.
        A convolutional network reads any image size; models/inputs.py checks the rest."""
        x = self.root(as_image_batch(x, next(self.parameters()), self.config))  # (B, C0, H/4, W/4)
        if record is not None:
            record.update(stem=x, stages=[])
        for stage in self.stages:
            for unit in stage.children():
                x = self.run_block(unit, x)  # (B, C_s, H/stride_s, W/stride_s)
            if record is not None:
                record["stages"].append(x)
        return F.relu(self.norm(x))

    def forward_head(self, feats: Tensor, pre_logits: bool = False) -> Tensor:
        """The map to logits; `pre_logits=True` stops at the pooled representation (B, C)."""
        x = feats.mean(dim=(2, 3))  # global average pooling
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor, return_intermediates: bool = False) -> Any:
        if not return_intermediates:
            return self.forward_head(self.forward_features(x))
        record: dict[str, Any] = {}
        feats = self.forward_features(x, record)
        representation = self.forward_head(feats, pre_logits=True)
        return {
            "logits": self.head(representation),
            "stem": record["stem"],  # after the root, (B, C0, H/4, W/4)
            "stages": record["stages"],  # per stage, (B, C_s, H/stride_s, W/stride_s)
            "features": feats,  # after the pre-head GN and ReLU, (B, C, h, w)
            "pre_logits": representation,  # what the head reads, (B, feature_dim)
        }
