"""The models' configurations: `ViTConfig` (with the hybrid's `ResNetConfig`), `BiTConfig`
(the paper's ResNet baseline), and the FLOP count of either.

Every default of the model lives here. A config is data: it can be written to JSON (inside a
checkpoint, into a run folder) and read back to rebuild exactly the same model. Each field is
checked where it is declared (see `fields.py`), whichever way the config is built.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Optional, Union

from vitlab.config.fields import ConfigError, check_fields, check_keys, plain, setting

CLASSIFIERS = ("token", "gap")
POS_EMBEDS = ("learned", "learned_2d", "sincos_2d", "sincos_2d_big_vision", "relative", "none")
# Where an absolute position embedding is added (App. D.4): once after the stem (the paper's
# default), at the input of every block with its own table, or at every block, one shared table.
POS_EMBED_AT = ("stem", "every_block", "every_block_shared")
GELUS = ("exact", "tanh")
RESIZE_MODES = ("bilinear_aligned", "bilinear", "bicubic", "bicubic_antialias")
HEAD_INITS = ("zeros", "xavier")
WS_MODES = ("std", "var")
BIT_STEMS = ("bit", "cifar")
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
CROP_MODES = ("squash", "center")
# Who resizes an image for evaluation: "pil" (PIL's filters: timm, torchvision's presets, the
# paper's own pipeline) or "tensor" (the image as a uint8 tensor, resized by torchvision's
# antialiased kernels: transformers 5.x's ViTImageProcessor). The two differ by a grey level here and there.
RESIZE_BACKENDS = ("pil", "tensor")


def as_pair(value: Any) -> Any:
    """An int or (height, width) as a (height, width) pair; other values are left for the type check."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (value, value)
    return value


@dataclass(frozen=True)
class ResNetConfig:
    """The BiT ResNet stem of a hybrid (paper §3.1): weight-standardised convs, GroupNorm.

    `layers` counts bottleneck units per stage. Three stages give a stride-16 feature map
    (root /4, then /2 per later stage), four give stride 32; none, the root alone (stride 4,
    64 x width_factor channels), is AugReg's R+Ti/16 (vision_transformer's `num_layers=()`).
    """

    layers: tuple[int, ...] = setting((3, 4, 9), check=lambda v: None if len(v) <= 4 and min(v, default=1) >= 1
                                      else "needs 0 to 4 stages of at least one unit each")
    width_factor: int = setting(1, at_least=1)
    # Weight standardisation: "std" is the official (w - mean) / (std + eps) with eps 1e-5;
    # "var" is (w - mean) / sqrt(var + eps), the form timm uses (with eps 1e-8).
    ws_eps: float = setting(1e-5, above=0)
    ws_mode: str = setting("std", one_of=WS_MODES)
    gn_eps: float = setting(1e-6, above=0)
    gn_groups: int = setting(32, at_least=1)

    def __post_init__(self) -> None:
        check_fields(self, "resnet")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ResNetConfig":
        return cls(**check_keys(cls, d, "resnet"))

    @property
    def stride(self) -> int:
        return 4 * 2 ** max(len(self.layers) - 1, 0)

    @property
    def out_channels(self) -> int:
        width = 64 * self.width_factor  # the root's; each stage ends with 4x its width
        return width * 4 * 2 ** (len(self.layers) - 1) if self.layers else width


def grid_of(image_size: tuple[int, int], patch: int, stem_stride: int = 1) -> tuple[int, int]:
    """The (rows, columns) of patches a VALID convolution of `patch` takes of an image, read
    through a "SAME"-padded stem of `stem_stride` (1: none)."""
    return tuple(math.ceil(side / stem_stride) // patch for side in image_size)  # type: ignore[return-value]


def ignored_pixels(image_size: tuple[int, int], patch: int, stem_stride: int = 1) -> tuple[int, int]:
    """(rows, columns) of image pixels past the patch grid: read by no patch."""
    grid = grid_of(image_size, patch, stem_stride)
    return tuple(max(0, side - g * patch * stem_stride) for side, g in zip(image_size, grid, strict=True))  # type: ignore[return-value]


def grid_note(config: Any) -> str:
    """What a ViT reads of its input, for plan lines: "" when its patches tile the image, else
    the grid and the pixels the VALID patch convolution leaves out (a ResNet: always "")."""
    rows, cols = getattr(config, "ignored_pixels", (0, 0))
    if not rows and not cols:
        return ""
    (gh, gw), (h, w), s = config.grid_size, config.image_size, config.total_stride
    return (f"a {gh}x{gw} grid of {s}-px patches at {h}x{w}: the last {rows} pixel rows and {cols} columns "
            "are read by no patch and ignored, as the official VALID patch convolution does")


def grid_record(config: Any) -> dict[str, Any]:
    """The patch grid and the ignored pixels, for results (summary.json, result.json, eval-SPLIT.json):
    {} for a model without patches (a ResNet)."""
    if not hasattr(config, "ignored_pixels"):
        return {}
    return {"grid": list(config.grid_size), "ignored_pixels": list(config.ignored_pixels)}


def _all_positive(v: tuple[float, ...]) -> Optional[str]:
    return None if min(v, default=1) > 0 else "must be positive"


def _check_preprocessing(cfg: Any) -> None:
    if len(cfg.mean) != cfg.in_channels or len(cfg.std) != cfg.in_channels:
        raise ConfigError(f"mean/std need one value per input channel ({cfg.in_channels}), got {len(cfg.mean)} and {len(cfg.std)}")


def _unit_interval(v: float) -> Optional[str]:
    return None if 0.0 <= v < 1.0 else "must be in [0, 1)"


class _StoredConfig:
    """What the model configs share: JSON out, a checked dict in, a checked replace."""

    def to_dict(self) -> dict[str, Any]:
        return plain(self)  # every tuple a list, a hybrid's resnet a mapping

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        return cls(**check_keys(cls, d, "model"))

    def replace(self, **overrides: Any) -> Any:
        """`dataclasses.replace` with a clear error for a misspelt field; `resnet` may be a dict."""
        return replace(self, **check_keys(type(self), overrides, "model"))  # type: ignore[type-var]  # self: a dataclass subclass


@dataclass(frozen=True)
class ViTConfig(_StoredConfig):
    """Everything that defines a Vision Transformer (paper §3.1, Table 1, Appendix D)."""

    name: str = "custom"
    image_size: tuple[int, int] = setting((224, 224), check=lambda v: None if min(v) > 0 else "must be positive")
    patch_size: int = setting(16, at_least=1)
    in_channels: int = setting(3, at_least=1)
    hidden_size: int = setting(768, at_least=1)  # D
    depth: int = setting(12, at_least=1)  # L
    num_heads: int = setting(12, at_least=1)
    mlp_dim: int = setting(3072, at_least=1)
    num_classes: int = setting(1000, at_least=0, hint="0 = no head, the model returns pooled features")
    classifier: str = setting("token", one_of=CLASSIFIERS)  # "token" (Eq. 4) or "gap" (App. D.3)
    pos_embed: str = setting("learned", one_of=POS_EMBEDS)  # App. D.4
    pos_embed_at: str = setting("stem", one_of=POS_EMBED_AT)  # App. D.4: where it is added
    representation_size: Optional[int] = setting(None, at_least=1)  # pre-logits Dense + tanh
    gelu: str = setting("tanh", one_of=GELUS)  # the official code's GELU (the JAX default); "exact" is erf
    layer_norm_eps: float = setting(1e-6, above=0)
    qkv_bias: bool = True
    dropout: float = setting(0.0, check=_unit_interval)
    attention_dropout: float = setting(0.0, check=_unit_interval)
    drop_path: float = setting(0.0, check=_unit_interval)
    head_init: str = setting("zeros", one_of=HEAD_INITS)  # the paper's fine-tuning head is zero-initialised
    resize_mode: str = setting("bilinear_aligned", one_of=RESIZE_MODES)  # how position embeddings follow a new size
    dynamic_image_size: bool = False  # resize position embeddings per forward to the input
    resnet: Optional[ResNetConfig] = None  # hybrid stem; the patch size then applies to its map
    # Preprocessing the weights expect: (pixel/255 - mean) / std. 0.5/0.5 maps to [-1, 1].
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = setting((0.5, 0.5, 0.5), check=_all_positive)
    # Evaluation crop: resize to image_size / crop_fraction, then centre-crop image_size.
    # 1.0 (no crop) is the paper's evaluation; ImageNet checkpoints often use 0.875 or 0.9.
    # "squash" resizes both sides to that size (the official code, HF's ViT processor);
    # "center" resizes the shorter side and keeps the aspect ratio (timm's "center" mode).
    crop_fraction: float = setting(1.0, above=0, at_most=1)
    crop_mode: str = setting("squash", one_of=CROP_MODES)
    interpolation: str = setting("bilinear", one_of=INTERPOLATIONS)  # of the image resize
    resize_backend: str = setting("pil", one_of=RESIZE_BACKENDS)  # the source library's resize (above)

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_size", as_pair(self.image_size))
        check_fields(self)
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; "
                              "pick a head count that divides the width")
        if self.pos_embed_at != "stem" and self.pos_embed in ("relative", "none"):
            raise ConfigError(f"pos_embed_at={self.pos_embed_at!r} needs an absolute position embedding, not pos_embed={self.pos_embed!r}")
        if self.pos_embed in ("learned_2d", "sincos_2d", "sincos_2d_big_vision") and self.hidden_size % 4:
            raise ConfigError(f"pos_embed={self.pos_embed!r} needs hidden_size divisible by 4")
        if self.pos_embed == "sincos_2d_big_vision" and self.hidden_size < 8:  # its frequencies divide by quarter - 1
            raise ConfigError(f"pos_embed='sincos_2d_big_vision' needs hidden_size of at least 8 (got {self.hidden_size})")
        _check_preprocessing(self)
        if min(self.grid_size) < 1:
            h, w = self.image_size
            raise ConfigError(f"image_size {h}x{w} is smaller than one patch of {self.name} ({self.total_stride} px); "
                              f"use at least image_size=({self.total_stride}, {self.total_stride})")

    # Derived quantities ------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return "vit"

    @property
    def has_attention(self) -> bool:  # what attention maps, rollout and attention distance need
        return True

    @property
    def total_stride(self) -> int:
        """Pixels per token side: the patch size, times the ResNet stride for a hybrid."""
        return self.patch_size * (self.resnet.stride if self.resnet else 1)

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid at image_size, as the official VALID patch convolution computes it:
        floor(side / patch) of the map it reads (a hybrid's ResNet, "SAME"-padded, gives
        ceil(side / its stride)); the pixels past the last whole patch are ignored (`ignored_pixels`)."""
        return grid_of(self.image_size, self.patch_size, self.resnet.stride if self.resnet else 1)

    @property
    def ignored_pixels(self) -> tuple[int, int]:
        """(rows, columns) of pixels at the bottom and right that no patch reads: 6 and 6 for
        a /14 model at 384 (a 27x27 grid covers 378 px)."""
        return ignored_pixels(self.image_size, self.patch_size, self.resnet.stride if self.resnet else 1)

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


def model_flops(cfg: "ModelConfig") -> float:
    """Multiply-accumulates x 2 of one forward pass of one image (matrix products and
    convolutions only; norms, activations and pooling are left out). This is the number
    `vitlab models` prints and a run's compute accounting multiplies."""
    if isinstance(cfg, BiTConfig):
        return bit_flops(cfg)
    t, d, n = cfg.num_tokens, cfg.hidden_size, cfg.num_patches
    per_block = 2 * t * d * 3 * d + 2 * 2 * t * t * d + 2 * t * d * d + 2 * 2 * t * d * cfg.mlp_dim
    if cfg.pos_embed == "relative":
        per_block += 2 * t * (2 * t - 1) * d
    in_dim = (cfg.resnet.out_channels if cfg.resnet is not None else cfg.in_channels) * cfg.patch_size**2
    flops: float = cfg.depth * per_block + 2 * n * in_dim * d
    if cfg.resnet is not None:
        flops += resnet_flops(cfg.resnet, cfg.image_size, cfg.in_channels)
    if cfg.representation_size:
        flops += 2 * d * cfg.representation_size
    if cfg.num_classes:
        flops += 2 * cfg.feature_dim * cfg.num_classes
    return float(flops)


def resnet_flops(r: ResNetConfig, image_size: tuple[int, int], in_channels: int) -> float:
    """Convolution FLOPs of a BiT ResNet (root and bottleneck stages) on one image."""
    return float(_convolution_flops(image_size, in_channels, 64 * r.width_factor, r.layers))


def _convolution_flops(image_size: tuple[int, int], in_channels: int, width: int, layers: tuple[int, ...],
                       pooled_root: bool = True) -> int:
    """The FLOPs of a BiT ResNet's root and bottleneck units on one image. The root is a 7x7/2
    convolution and a 3x3/2 max-pool (`pooled_root`), else one 3x3/1 convolution, `width`
    channels; stage s has units of middle width `width` x 2^s, and a unit's 3x3 carries its
    stride (the first of every stage after the first), as in the official code."""
    h, w = image_size
    if pooled_root:
        h, w = math.ceil(h / 2), math.ceil(w / 2)  # 7x7/2, padding 3
        flops = 2 * h * w * 49 * in_channels * width
        h, w = math.ceil(h / 2), math.ceil(w / 2)  # zero pad 1, 3x3/2 max-pool
    else:
        flops = 2 * h * w * 9 * in_channels * width
    cin = width
    for s, units in enumerate(layers):
        mid = width * 2**s
        out = 4 * mid
        for u in range(units):
            stride = 2 if (s > 0 and u == 0) else 1
            ho, wo = math.ceil(h / stride), math.ceil(w / stride)
            flops += 2 * h * w * cin * mid + 2 * ho * wo * 9 * mid * mid + 2 * ho * wo * mid * out
            if u == 0:
                flops += 2 * ho * wo * cin * out  # the projection shortcut
            h, w, cin = ho, wo, out
    return flops


# The BiT ResNet, the paper's baseline (§4.1, "BiT ResNets") ---------------------------------
def _stages(v: tuple[int, ...]) -> Optional[str]:
    return None if len(v) >= 1 and min(v) >= 1 else "needs at least one stage of at least one unit"


@dataclass(frozen=True)
class BiTConfig(_StoredConfig):
    """A pre-activation ResNet-v2 as Big Transfer builds it (Kolesnikov et al. 2020): weight-
    standardised convolutions, GroupNorm, the 7x7/2 root with a 3x3/2 max-pool, bottleneck
    units of width 64 * 2^s * width_factor, and a head of GroupNorm, ReLU, global average
    pooling and one linear layer.

    `stem="cifar"` replaces the root by one 3x3/1 convolution and no pooling, the usual stem
    for 32 px images (a 7x7/2 root and a max-pool would leave an 8x8 map before stage 1).
    `base_width` is the root's width before the factor (64 in every BiT model); CPU-sized
    members halve it.
    """

    name: str = "custom-bit"
    image_size: tuple[int, int] = setting((224, 224), check=lambda v: None if min(v) > 0 else "must be positive")
    in_channels: int = setting(3, at_least=1)
    layers: tuple[int, ...] = setting((3, 4, 6, 3), check=_stages)  # units per stage; R50 = (3, 4, 6, 3)
    width_factor: int = setting(1, at_least=1)  # the "x1", "x3" of BiT-R50x3
    base_width: int = setting(64, at_least=1)
    stem: str = setting("bit", one_of=BIT_STEMS)
    num_classes: int = setting(1000, at_least=0, hint="0 = no head, the model returns pooled features")
    # Weight standardisation (w - mean) / sqrt(var + eps): eps 1e-10 in the official code,
    # 1e-8 in timm. GroupNorm eps 1e-5 in the official PyTorch port and in timm.
    ws_eps: float = setting(1e-10, above=0)
    gn_eps: float = setting(1e-5, above=0)
    gn_groups: int = setting(32, at_least=1)
    # Preprocessing and evaluation crop, as in ViTConfig; BiT scales pixels to [-1, 1] too.
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = setting((0.5, 0.5, 0.5), check=_all_positive)
    crop_fraction: float = setting(1.0, above=0, at_most=1)  # as ViTConfig's
    crop_mode: str = setting("squash", one_of=CROP_MODES)
    interpolation: str = setting("bilinear", one_of=INTERPOLATIONS)
    resize_backend: str = setting("pil", one_of=RESIZE_BACKENDS)
    head_init: str = setting("zeros", one_of=HEAD_INITS)  # BiT starts transfer from a zero head

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_size", as_pair(self.image_size))
        check_fields(self)
        _check_preprocessing(self)
        for width in (self.root_width, *self.stage_widths):
            if width % self.gn_groups:
                raise ConfigError(f"{self.name}: a layer of width {width} cannot be split into gn_groups={self.gn_groups} "
                                  "GroupNorm groups; pick base_width and width_factor so every width is a multiple of it")

    @property
    def kind(self) -> str:
        return "bit"

    @property
    def has_attention(self) -> bool:  # a ResNet: convolutions only
        return False

    @property
    def root_width(self) -> int:
        return self.base_width * self.width_factor

    @property
    def stage_widths(self) -> tuple[int, ...]:
        """The bottleneck (middle) width of each stage; a unit's output is 4 times it."""
        return tuple(self.root_width * 2**s for s in range(len(self.layers)))

    @property
    def feature_dim(self) -> int:
        """Width of the representation the head reads: the last stage's output."""
        return 4 * self.stage_widths[-1]

    @property
    def depth(self) -> int:
        """Layers with weights on the main path, as the name counts them: R50 = 3 x 16 + 2."""
        return 3 * sum(self.layers) + 2

    @property
    def stride(self) -> int:
        return (4 if self.stem == "bit" else 1) * 2 ** (len(self.layers) - 1)


def bit_flops(cfg: BiTConfig) -> float:
    """Convolution and head FLOPs of a BiT ResNet on one image (the 3x3 of a unit carries its
    stride, as in the official code)."""
    flops = _convolution_flops(cfg.image_size, cfg.in_channels, cfg.root_width, cfg.layers, cfg.stem == "bit")
    if cfg.num_classes:
        flops += 2 * cfg.feature_dim * cfg.num_classes
    return float(flops)


# The model kinds: a checkpoint stores the kind beside the config; "vit" when it is absent.
ModelConfig = Union[ViTConfig, BiTConfig]
CONFIG_KINDS: dict[str, type[ViTConfig] | type[BiTConfig]] = {"vit": ViTConfig, "bit": BiTConfig}


def config_kind(cfg: ModelConfig) -> str:
    return "bit" if isinstance(cfg, BiTConfig) else "vit"


def config_from_dict(d: dict[str, Any], kind: str = "vit") -> ModelConfig:
    """The config of a stored model; `kind` is what `config_kind` said when it was written."""
    if kind not in CONFIG_KINDS:
        raise ConfigError(f"unknown model kind {kind!r}; known kinds: {', '.join(CONFIG_KINDS)}")
    return CONFIG_KINDS[kind].from_dict(d)
