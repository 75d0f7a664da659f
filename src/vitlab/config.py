"""Configuration as plain frozen dataclasses.

Every default of the model lives here. A config is data: it can be written to JSON (inside a
checkpoint, into a run folder) and read back to rebuild exactly the same model.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, fields, replace
from typing import Any, Optional

CLASSIFIERS = ("token", "gap")
POS_EMBEDS = ("learned", "learned_2d", "sincos_2d", "relative", "none")
GELUS = ("exact", "tanh")
RESIZE_MODES = ("bilinear_aligned", "bilinear", "bicubic", "bicubic_antialias")
HEAD_INITS = ("zeros", "xavier")
WS_MODES = ("std", "var")


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the field and the fix."""


def _pair(value: Any, name: str) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ConfigError(f"{name} must be an int or (height, width), got {value!r}")
        h, w = value
    else:
        h = w = value
    try:
        h, w = int(h), int(w)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an int or (height, width), got {value!r}") from None
    if h <= 0 or w <= 0:
        raise ConfigError(f"{name} must be positive, got {value!r}")
    return h, w


def _choice(value: str, name: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(repr(c) for c in choices)}")


@dataclass(frozen=True)
class ResNetConfig:
    """The BiT ResNet stem of a hybrid (paper §3.1): weight-standardised convs, GroupNorm.

    `layers` counts bottleneck units per stage. Three stages give a stride-16 feature map
    (root /4, then /2 per later stage), four give stride 32.
    """

    layers: tuple[int, ...] = (3, 4, 9)
    width_factor: int = 1
    # Weight standardisation: "std" is the official (w - mean) / (std + eps) with eps 1e-5;
    # "var" is (w - mean) / sqrt(var + eps), the form timm uses (with eps 1e-8).
    ws_eps: float = 1e-5
    ws_mode: str = "std"
    gn_eps: float = 1e-6
    gn_groups: int = 32

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(int(n) for n in self.layers))
        if not 1 <= len(self.layers) <= 4 or any(n < 1 for n in self.layers):
            raise ConfigError(f"resnet.layers must be 1 to 4 positive unit counts, got {self.layers}")
        _choice(self.ws_mode, "resnet.ws_mode", WS_MODES)

    @property
    def stride(self) -> int:
        return 4 * 2 ** (len(self.layers) - 1)

    @property
    def out_channels(self) -> int:
        return 64 * self.width_factor * 4 * 2 ** (len(self.layers) - 1)


@dataclass(frozen=True)
class ViTConfig:
    """Everything that defines a Vision Transformer (paper §3.1, Table 1, Appendix D)."""

    name: str = "custom"
    image_size: tuple[int, int] = (224, 224)
    patch_size: int = 16
    in_channels: int = 3
    hidden_size: int = 768  # D
    depth: int = 12  # L
    num_heads: int = 12
    mlp_dim: int = 3072
    num_classes: int = 1000  # 0: no head, the model returns pooled features
    classifier: str = "token"  # "token" (Eq. 4) or "gap" (App. D.3)
    pos_embed: str = "learned"  # App. D.4
    representation_size: Optional[int] = None  # pre-logits Dense + tanh
    gelu: str = "tanh"  # the official code's GELU (the JAX default); "exact" is erf
    layer_norm_eps: float = 1e-6
    qkv_bias: bool = True
    dropout: float = 0.0
    attention_dropout: float = 0.0
    drop_path: float = 0.0
    head_init: str = "zeros"  # the paper's fine-tuning head is zero-initialised
    resize_mode: str = "bilinear_aligned"  # how position embeddings follow a new image size
    dynamic_image_size: bool = False  # resize position embeddings per forward to the input
    resnet: Optional[ResNetConfig] = None  # hybrid stem; the patch size then applies to its map
    # Preprocessing the weights expect: (pixel/255 - mean) / std. 0.5/0.5 maps to [-1, 1].
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen dataclass
        set_("image_size", _pair(self.image_size, "image_size"))
        if isinstance(self.resnet, dict):
            set_("resnet", ResNetConfig(**self.resnet))
        set_("mean", tuple(float(m) for m in self.mean))
        set_("std", tuple(float(s) for s in self.std))
        if self.representation_size is not None:
            set_("representation_size", int(self.representation_size))
        _choice(self.classifier, "classifier", CLASSIFIERS)
        _choice(self.pos_embed, "pos_embed", POS_EMBEDS)
        _choice(self.gelu, "gelu", GELUS)
        _choice(self.resize_mode, "resize_mode", RESIZE_MODES)
        _choice(self.head_init, "head_init", HEAD_INITS)
        for k in ("patch_size", "in_channels", "hidden_size", "depth", "num_heads", "mlp_dim"):
            if int(getattr(self, k)) < 1:
                raise ConfigError(f"{k} must be at least 1, got {getattr(self, k)}")
        if self.num_classes < 0:
            raise ConfigError(f"num_classes must be >= 0 (0 = no head), got {self.num_classes}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; "
                "pick a head count that divides the width"
            )
        if self.pos_embed in ("learned_2d", "sincos_2d") and self.hidden_size % 4:
            raise ConfigError(f"pos_embed={self.pos_embed!r} needs hidden_size divisible by 4")
        if len(self.mean) != self.in_channels or len(self.std) != self.in_channels:
            raise ConfigError(
                f"mean/std need one value per input channel ({self.in_channels}), "
                f"got {len(self.mean)} and {len(self.std)}"
            )
        for k in ("dropout", "attention_dropout", "drop_path"):
            if not 0.0 <= getattr(self, k) < 1.0:
                raise ConfigError(f"{k} must be in [0, 1), got {getattr(self, k)}")
        stride = self.total_stride
        h, w = self.image_size
        if h % stride or w % stride:
            fix_h, fix_w = max(stride, round(h / stride) * stride), max(stride, round(w / stride) * stride)
            raise ConfigError(
                f"image_size {h}x{w} is not divisible by the patch stride {stride} of {self.name}; "
                f"use a multiple of {stride}, e.g. image_size=({fix_h}, {fix_w})"
            )

    # Derived quantities ------------------------------------------------------------------
    @property
    def total_stride(self) -> int:
        """Pixels per token side: the patch size, times the ResNet stride for a hybrid."""
        return self.patch_size * (self.resnet.stride if self.resnet else 1)

    @property
    def grid_size(self) -> tuple[int, int]:
        h, w = self.image_size
        return h // self.total_stride, w // self.total_stride

    @property
    def num_patches(self) -> int:
        gh, gw = self.grid_size
        return gh * gw

    @property
    def has_class_token(self) -> bool:
        return self.classifier == "token"

    @property
    def num_tokens(self) -> int:
        return self.num_patches + int(self.has_class_token)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def feature_dim(self) -> int:
        """Width of the representation the head sees (pre-logits if present)."""
        return self.representation_size or self.hidden_size

    # Serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["image_size"] = list(self.image_size)
        if self.resnet is not None:
            d["resnet"]["layers"] = list(self.resnet.layers)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ViTConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(
                f"unknown model config field(s) {unknown}; valid fields: {', '.join(sorted(known))}"
            )
        return cls(**d)

    def replace(self, **overrides: Any) -> "ViTConfig":
        return apply_overrides(self, overrides)


def apply_overrides(cfg: ViTConfig, overrides: dict[str, Any]) -> ViTConfig:
    """`replace` with a clear error for a misspelt field; `resnet` may be a dict."""
    known = {f.name for f in fields(ViTConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(
            f"unknown model option(s) {unknown}; valid options: {', '.join(sorted(known))}"
        )
    return replace(cfg, **overrides)


def model_flops(cfg: ViTConfig) -> float:
    """Multiply-accumulates x 2 of one forward pass of one image (matrix products only)."""
    t, d, n = cfg.num_tokens, cfg.hidden_size, cfg.num_patches
    per_block = 2 * t * d * 3 * d + 2 * 2 * t * t * d + 2 * t * d * d + 2 * 2 * t * d * cfg.mlp_dim
    if cfg.pos_embed == "relative":
        per_block += 2 * t * (2 * t - 1) * d
    in_dim = cfg.in_channels * cfg.patch_size**2
    if cfg.resnet is not None:
        in_dim = cfg.resnet.out_channels * cfg.patch_size**2
    flops = cfg.depth * per_block + 2 * n * in_dim * d
    if cfg.resnet is not None:
        flops += resnet_flops(cfg)
    if cfg.representation_size:
        flops += 2 * d * cfg.representation_size
    if cfg.num_classes:
        flops += 2 * cfg.feature_dim * cfg.num_classes
    return float(flops)


def resnet_flops(cfg: ViTConfig) -> float:
    """Convolution FLOPs of a hybrid's BiT ResNet stem."""
    assert cfg.resnet is not None
    r = cfg.resnet
    h, w = cfg.image_size
    h, w = math.ceil(h / 2), math.ceil(w / 2)
    width = 64 * r.width_factor
    flops = 2 * h * w * 7 * 7 * cfg.in_channels * width
    h, w = math.ceil(h / 2), math.ceil(w / 2)
    cin = width
    for s, units in enumerate(r.layers):
        mid = width * 2**s
        out = mid * 4
        for u in range(units):
            stride = 2 if (s > 0 and u == 0) else 1
            ho, wo = math.ceil(h / stride), math.ceil(w / stride)
            flops += 2 * h * w * cin * mid + 2 * ho * wo * 9 * mid * mid + 2 * ho * wo * mid * out
            if u == 0:
                flops += 2 * ho * wo * cin * out
            h, w, cin = ho, wo, out
    return float(flops)


__all__ = [
    "ConfigError",
    "ResNetConfig",
    "ViTConfig",
    "apply_overrides",
    "model_flops",
    "CLASSIFIERS",
    "POS_EMBEDS",
    "GELUS",
    "RESIZE_MODES",
]
