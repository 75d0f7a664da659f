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


# What `vitlab bench` can time: fp32 (the model as it is); fp32 with oneDNN-packed Dense
# layers (vitlab.deploy); bf16 autocast over fp32 weights; bf16 weights and activations
# (vitlab's packed copy); int8 Dense layers.
BENCH_TASKS = ("infer", "train")
BENCH_PRECISIONS = ("fp32", "fp32-packed", "bf16-autocast", "bf16", "int8")


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


# =========================================================================================
# Training runs: data, optimiser, loop (issue 4). A run is four sections -- model, data,
# optim, train -- read from a YAML recipe, changed by "section.key=value" overrides, and
# written back as the resolved `config.yaml` of the run folder. Defaults live here only.
# =========================================================================================
OPTIMIZERS = ("adamw", "adam", "sgd")
DECAYS = ("cosine", "linear", "constant")
PRECISIONS = ("fp32", "bf16")
PARALLEL = ("ddp", "fsdp")


def _coerce(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """Turn YAML/command-line values into the field's type ("1e-3" -> 0.001, [a, b] -> tuple).

    The type is read from the field's default, so a typo such as lr="fast" fails here with the
    field's name instead of deep inside the optimiser.
    """
    out = {}
    by_name = {f.name: f for f in fields(cls)}
    for k, v in d.items():
        default = by_name[k].default
        try:
            if v is None or isinstance(default, str) and default != "" and isinstance(v, str):
                out[k] = v
            elif isinstance(default, bool):
                if isinstance(v, str) and v.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
                    v = v.lower() in ("true", "yes", "on", "1")
                if not isinstance(v, bool):
                    raise ValueError
                out[k] = v
            elif isinstance(default, float):
                out[k] = float(v)
            elif isinstance(default, int):
                if isinstance(v, float) and not v.is_integer():
                    raise ValueError
                out[k] = int(v)
            elif isinstance(default, tuple):
                out[k] = tuple(v) if isinstance(v, (list, tuple)) else (v,)
            else:
                out[k] = v
        except (TypeError, ValueError):
            raise ConfigError(f"{cls.SECTION}.{k}={v!r} is not a valid {type(default).__name__}") from None
    return out


def _section_from_dict(cls: type, d: Optional[dict[str, Any]]) -> Any:
    d = dict(d or {})
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(cls.SECTION + '.' + k for k in unknown)}; "
            f"valid {cls.SECTION} keys: {', '.join(known)}"
        )
    return cls(**_coerce(cls, d))


@dataclass(frozen=True)
class DataConfig:
    """Where the images come from and how they are augmented (§4.1, Appendix B.1)."""

    SECTION = "data"
    name: str = "digits"  # a spec for vitlab.data.open_dataset: digits, cifar10:DIR, wds:PATTERN, ...
    train_split: str = "train"
    eval_splits: tuple[str, ...] = ("test",)
    eval_data: str = ""  # another spec for evaluation (e.g. the test shards of a wds set); "" = name
    num_workers: int = 0
    # Inception-style crop (the paper's training preprocessing): area and aspect-ratio ranges.
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (0.75, 1.3333333333333333)
    hflip: bool = True
    randaugment: int = 0  # number of RandAugment ops per image; 0 = off
    randaugment_magnitude: int = 9
    dev_fraction: float = -1.0  # held-out dev share; < 0: the dataset's paper value (2% CIFAR, 10% else)
    skip_bad_images: bool = False
    shuffle_buffer: int = 2000  # samples held for shuffling a streamed (wds) set
    classes: tuple[str, ...] = ()  # class names of a wds set (else classes.txt beside the shards, else 0..K-1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "eval_splits", tuple(self.eval_splits))
        object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))
        if self.num_workers < 0 or self.randaugment < 0:
            raise ConfigError("data.num_workers and data.randaugment must be >= 0")
        if len(self.crop_scale) != 2 or not 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1:
            raise ConfigError(f"data.crop_scale must be (low, high) with 0 < low <= high <= 1, got {self.crop_scale}")
        if self.dev_fraction >= 1:
            raise ConfigError(f"data.dev_fraction must be below 1, got {self.dev_fraction}")


@dataclass(frozen=True)
class OptimConfig:
    """Optimiser and learning-rate schedule (Appendix B.1, Table 3 and 4)."""

    SECTION = "optim"
    name: str = "adamw"  # adamw (decoupled weight decay), adam, sgd
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.9  # sgd only
    weight_decay: float = 0.0  # applied to matrices only (dim >= 2, not embeddings or tokens)
    clip_grad_norm: float = 1.0  # global norm; 0 = off
    warmup_steps: int = 0  # linear warm-up from 0
    decay: str = "cosine"  # after warm-up: cosine or linear to end_lr, or constant
    end_lr: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        _choice(self.name, "optim.name", OPTIMIZERS)
        _choice(self.decay, "optim.decay", DECAYS)
        if self.lr <= 0 or self.weight_decay < 0 or self.clip_grad_norm < 0 or self.warmup_steps < 0:
            raise ConfigError("optim.lr must be > 0; weight_decay, clip_grad_norm and warmup_steps >= 0")


@dataclass(frozen=True)
class TrainConfig:
    """The loop: length, batch, checkpoints, precision, regularisers, objective."""

    SECTION = "train"
    objective: str = "supervised"  # a name in vitlab.train.objectives.OBJECTIVES
    steps: int = 0  # optimiser steps; 0 = from epochs
    epochs: float = 0.0  # used when steps is 0
    batch_size: int = 128  # global: across processes and accumulation steps
    micro_batch_size: int = 0  # per process and forward pass; 0 = the whole per-process batch
    seed: int = 0
    eval_every: int = 0  # steps; 0 = only at the end
    log_every: int = 10
    ckpt_every: int = 500  # steps; a checkpoint is always written at the end
    keep_checkpoints: int = 3
    ema: float = 0.0  # Polyak averaging factor (the paper's 0.9999); 0 = off
    label_smoothing: float = 0.0
    mixup: float = 0.0  # Beta(alpha, alpha) of torchvision's MixUp; 0 = off
    cutmix: float = 0.0
    precision: str = "fp32"  # bf16 = autocast to bfloat16
    grad_checkpointing: bool = False
    compile: bool = False  # torch.compile the objective
    parallel: str = "ddp"  # with torchrun: ddp or fsdp
    device: str = "auto"  # auto = cuda when available, else cpu
    threads: int = 0  # torch CPU threads per process; 0 = torch's default (one per core)
    eval_batch_size: int = 0  # 0 = batch_size

    def __post_init__(self) -> None:
        _choice(self.precision, "train.precision", PRECISIONS)
        _choice(self.parallel, "train.parallel", PARALLEL)
        if self.steps < 0 or self.epochs < 0 or self.batch_size < 1 or self.micro_batch_size < 0:
            raise ConfigError("train.steps/epochs must be >= 0 and train.batch_size >= 1")
        if self.ckpt_every < 1 or self.keep_checkpoints < 1 or self.log_every < 1:
            raise ConfigError("train.ckpt_every, train.keep_checkpoints and train.log_every must be >= 1")
        if not 0.0 <= self.ema < 1.0:
            raise ConfigError(f"train.ema must be in [0, 1), got {self.ema}")


# Keys of the model section besides ViTConfig's fields.
MODEL_EXTRA_KEYS = ("checkpoint",)


@dataclass(frozen=True)
class RunConfig:
    """One training run. `model` is a dict: `name` (a registered variant, or the name a
    checkpoint gives) plus any ViTConfig field to change; `checkpoint` starts from saved weights."""

    model: dict[str, Any] = dataclasses.field(default_factory=lambda: {"name": "ViT-Ti/4"})
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    # Options of the objective named by train.objective (e.g. masked patch prediction's mask
    # rate); the objective's own config class checks them when the trainer builds it.
    objective: dict[str, Any] = dataclasses.field(default_factory=dict)

    SECTIONS = {"data": DataConfig, "optim": OptimConfig, "train": TrainConfig}

    def __post_init__(self) -> None:
        valid = sorted({f.name for f in fields(ViTConfig)} | set(MODEL_EXTRA_KEYS))
        unknown = sorted(set(self.model) - set(valid))
        if unknown:
            raise ConfigError(
                f"unknown key(s) {', '.join('model.' + k for k in unknown)}; valid model keys: {', '.join(valid)}"
            )

    def to_dict(self) -> dict[str, Any]:
        def plain(v: Any) -> Any:
            if isinstance(v, tuple):
                return [plain(x) for x in v]
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            return v

        out: dict[str, Any] = {"model": plain(dict(self.model))}
        for name in self.SECTIONS:
            out[name] = {f.name: plain(getattr(getattr(self, name), f.name)) for f in fields(self.SECTIONS[name])}
        out["objective"] = plain(dict(self.objective))
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"a recipe must be a mapping of sections, got {type(d).__name__}")
        unknown = sorted(set(d) - {"model", "objective", *cls.SECTIONS})
        if unknown:
            raise ConfigError(
                f"unknown section(s) {unknown}; valid sections: model, {', '.join(cls.SECTIONS)}, objective"
            )
        model = dict(d.get("model") or {"name": "ViT-Ti/4"})
        sections = {k: _section_from_dict(c, d.get(k)) for k, c in cls.SECTIONS.items()}
        return cls(model=model, objective=dict(d.get("objective") or {}), **sections)

    def with_overrides(self, overrides: dict[str, Any]) -> "RunConfig":
        """Apply {"optim.lr": 0.01, "model.dropout": 0.1, ...}; a wrong key names the valid ones."""
        d = self.to_dict()
        for key, value in overrides.items():
            section, _, name = key.partition(".")
            if section not in d or not name:
                raise ConfigError(
                    f"bad override key {key!r}: write SECTION.KEY=VALUE with SECTION one of "
                    f"model, {', '.join(self.SECTIONS)}, objective (e.g. optim.lr=0.001)"
                )
            if section not in ("model", "objective") and name not in d[section]:
                raise ConfigError(f"unknown key {key!r}; valid {section} keys: {', '.join(d[section])}")
            d[section][name] = value
        return RunConfig.from_dict(d)


def parse_override(text: str) -> tuple[str, Any]:
    """"optim.lr=1e-3" -> ("optim.lr", 0.001); values are read as YAML (lists, null, true)."""
    import yaml

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"bad override {text!r}: write SECTION.KEY=VALUE, e.g. optim.weight_decay=0.05")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
        try:
            value = float(value)
        except ValueError:
            pass
    return key.strip(), value


def load_recipe(path_or_name: str) -> RunConfig:
    """A recipe file, or the name of one shipped in vitlab/configs ("digits", "cifar10", ...)."""
    import yaml
    from pathlib import Path

    path = Path(path_or_name)
    if not path.is_file():
        shipped = Path(__file__).parent / "configs" / f"{path_or_name}.yaml"
        if not shipped.is_file():
            names = sorted(p.stem for p in (Path(__file__).parent / "configs").glob("*.yaml"))
            raise ConfigError(f"no recipe file {path_or_name!r}; shipped recipes: {', '.join(names)}")
        path = shipped
    try:
        d = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    try:
        return RunConfig.from_dict(d)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


__all__ += ["DataConfig", "OptimConfig", "TrainConfig", "RunConfig", "load_recipe", "parse_override"]


# =========================================================================================
# Masked patch prediction (issue 6, §4.6, Appendix B.1.2): the options of objective "mpp",
# read from a recipe's `objective:` section or `objective.KEY=VALUE` overrides.
# =========================================================================================
MPP_TARGETS = ("mean_color", "color_grid", "pixels")


@dataclass(frozen=True)
class MPPConfig:
    """Masked patch prediction; every default is the paper's."""

    SECTION = "objective"
    mask_rate: float = 0.5  # share of each image's patches that are corrupted
    mask_token_frac: float = 0.8  # of the corrupted: replaced by the learnable [mask] embedding
    random_patch_frac: float = 0.1  # of the corrupted: replaced by a random other patch; rest kept
    target: str = "mean_color"  # mean_color (1 x 512 classes), color_grid (4x4 x 512), pixels (L2)
    bits: int = 3  # per colour channel: 3 bits -> 8^3 = 512 RGB classes
    grid: int = 4  # cells per patch side for target=color_grid

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_rate <= 1.0:
            raise ConfigError(f"objective.mask_rate must be in (0, 1], got {self.mask_rate} (the paper: 0.5)")
        for k in ("mask_token_frac", "random_patch_frac"):
            if not 0.0 <= getattr(self, k) <= 1.0:
                raise ConfigError(f"objective.{k} must be in [0, 1], got {getattr(self, k)}")
        if self.mask_token_frac + self.random_patch_frac > 1.0 + 1e-9:
            raise ConfigError(
                f"objective.mask_token_frac + objective.random_patch_frac = "
                f"{self.mask_token_frac + self.random_patch_frac:g} exceeds 1; lower one of them "
                "(the rest, 0.1 in the paper, is the share of corrupted patches left unchanged)"
            )
        _choice(self.target, "objective.target", MPP_TARGETS)
        if not 1 <= self.bits <= 4:
            raise ConfigError(f"objective.bits must be 1 to 4, got {self.bits} (the paper: 3, i.e. 512 colours)")
        if self.grid < 1:
            raise ConfigError(f"objective.grid must be at least 1, got {self.grid} (the paper: 4)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> "MPPConfig":
        return _section_from_dict(cls, d)


__all__ += ["MPPConfig", "MPP_TARGETS"]
