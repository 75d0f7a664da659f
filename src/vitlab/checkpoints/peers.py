"""Model names as a user types them: vitlab's variants (models/variants.py) and the names timm
and Hugging Face give the paper's models, read as vitlab's, with the numerics and default
preprocessing of the library the name comes from. `variant_config` is the one reader of a
model name, in whichever spelling.

- timm: `vit_tiny_patch16_224` (a size, a patch, a resolution), optionally with the tag that
  selects weights (`vit_tiny_patch16_224.augreg_in21k_ft_in1k`), and the hybrids
  `vit_base_r50_s16_384`. The model computes as timm's does (exact GELU, LayerNorm eps 1e-6,
  bicubic position-embedding resizing) and is preprocessed as timm's `pretrained_cfg` says
  (mean = std = 0.5; resize the shorter side bicubically to image/crop_pct and centre-crop,
  crop_pct 0.9 below 384 px and 1.0 from 384 px on).
- Hugging Face: `google/vit-base-patch16-224` (and `-in21k`), as an architecture: exact GELU,
  LayerNorm eps 1e-12, and ViTImageProcessor's defaults (the whole image resized bilinearly to
  the model's size with torchvision's kernels, mean = std = 0.5).

`PeerName` says which registered variant a name stands for and what differs from it. The
checkpoint readers use the same numerics and preprocessing for a file that names no
preprocessing (timm.py, hf.py). These names live here, beside the readers of those libraries'
files, and not in models/, which knows only the paper's notation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from vitlab import suggest
from vitlab.config import ConfigError, ModelConfig, ResNetConfig, ViTConfig
from vitlab.models.variants import MODELS, resolve_name, with_changes

TIMM_SIZES = {"tiny": "Ti", "small": "S", "base": "B", "large": "L", "huge": "H"}
HF_SIZES = {"base": "B", "large": "L", "huge": "H"}
KNOWN_MODELS_HINT = "`vitlab models` lists them; timm's and Hugging Face's names work too (vit_tiny_patch16_224)"


def variant_config(name: str, **changes: Any) -> ModelConfig:
    """The model a name stands for, with some fields changed (a changed shape is named as such:
    models/variants.with_changes): a registered variant in the paper's notation, in any spelling
    `resolve_name` reads ("ViT-B/16", "vit-b-16"), or timm's or Hugging Face's name for one
    ("vit_tiny_patch16_224", "google/vit-base-patch16-224"), with that library's numerics and
    preprocessing. An unknown name is refused with the near ones."""
    try:
        peer = read_peer_name(name)  # None for the paper's notation: the patterns cannot match it
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        base = MODELS[peer.variant if peer else resolve_name(name)]
    except KeyError:
        raise ConfigError(suggest.unknown("model", name, MODELS, KNOWN_MODELS_HINT)) from None
    if peer is not None and isinstance(base, ViTConfig):  # (every name of theirs is a ViT's)
        base = peer.config(base)
    return with_changes(base, **changes)


def timm_numerics(cfg: ViTConfig) -> ViTConfig:
    """timm's numerics: exact GELU, LayerNorm eps 1e-6, bicubic position-embedding resizing, and
    in its hybrids `StdConv2dSame(eps=1e-8)` -- (w - mean) / sqrt(var + 1e-8) -- with GroupNorm
    eps 1e-5 (timm/models/vision_transformer_hybrid.py `_resnetv2`, timm/layers/std_conv.py)."""
    resnet = cfg.resnet
    if resnet is not None:
        resnet = ResNetConfig(layers=resnet.layers, width_factor=resnet.width_factor, ws_eps=1e-8, ws_mode="var", gn_eps=1e-5)
    return cfg.replace(gelu="exact", layer_norm_eps=1e-6, resize_mode="bicubic", resnet=resnet)

# transformers' ViTConfig defaults and ViTImageProcessor's (resample=2 is PIL's bilinear;
# transformers 5 resizes a uint8 tensor with torchvision's antialiased kernels).
HF_NUMERICS = {"gelu": "exact", "layer_norm_eps": 1e-12, "resize_mode": "bicubic"}
HF_PREPROCESSING: dict[str, Any] = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "interpolation": "bilinear",
                    "crop_mode": "squash", "crop_fraction": 1.0, "resize_backend": "tensor"}

# timm's default tag (the weights `timm.create_model(NAME, pretrained=True)` loads) where it is
# not augreg_in21k_ft_in1k: (size, patch or stride, resolution, hybrid depth) -> tag.
TIMM_DEFAULT_TAGS = {("B", 16, 224, 0): "augreg2_in21k_ft_in1k", ("B", 8, 224, 0): "augreg2_in21k_ft_in1k",
                     ("L", 32, 224, 0): "orig_in21k", ("H", 14, 224, 0): "orig_in21k", ("L", 32, 384, 0): "orig_in21k_ft_in1k",
                     ("B", 16, 224, 50): "orig_in21k", ("B", 16, 384, 50): "orig_in21k_ft_in1k"}
TIMM_TAG = "augreg_in21k_ft_in1k"


def timm_preprocessing(image_size: int) -> dict[str, Any]:
    """timm's pretrained_cfg for its ViTs at this resolution (what resolve_data_config reads)."""
    return {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "interpolation": "bicubic", "crop_mode": "center",
            "crop_fraction": 0.9 if image_size < 384 else 1.0, "resize_backend": "pil"}


def tag_classes(tag: str) -> Optional[int]:
    """The head a timm tag's weights have: ImageNet-1k's 1000 classes, ImageNet-21k's 21,843
    (none for the original in21k release, whose head timm drops), or None for an unknown tag."""
    if tag.endswith("in1k"):
        return 1000
    if tag.endswith("in21k"):
        return 0 if tag.startswith("orig") else 21843
    return None


@dataclass(frozen=True)
class PeerName:
    """A peer's name read: the registered variant it stands for, the fields that differ (numerics,
    resolution, head, preprocessing), and the weights it selects (a Hub name) where it names some."""

    library: str  # "timm" or "Hugging Face"
    variant: str  # "ViT-Ti/16"
    changes: dict[str, Any] = field(default_factory=dict)
    weights: str = ""  # "timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k", "hf-hub:google/vit-base-patch16-224"

    def config(self, base: ViTConfig) -> ViTConfig:
        """The registered variant's config as the peer builds it."""
        cfg = base.replace(**self.changes)
        return timm_numerics(cfg) if self.library == "timm" else cfg


_TIMM = re.compile(r"^vit_(tiny|small|base|large|huge)_(?:patch(\d+)|r(26|50)_s(16|32))_(\d+)(?:\.(\w+))?$")
_HF = re.compile(r"^google/vit-(base|large|huge)-patch(\d+)-(\d+)(-in21k)?$")


def timm_name(variant: str, resolution: int = 224) -> Optional[str]:
    """timm's name for a registered variant ("ViT-Ti/16" -> "vit_tiny_patch16_224",
    "R50+ViT-B/16" -> "vit_base_r50_s16_224"), or None for one timm has no name for."""
    m = re.fullmatch(r"(?:R(26|50)\+)?ViT-(Ti|S|B|L|H)/(\d+)", variant)
    if not m:
        return None
    depth, letter, step = m.groups()
    size = next(k for k, v in TIMM_SIZES.items() if v == letter)
    return f"vit_{size}_{f'r{depth}_s{step}' if depth else f'patch{step}'}_{resolution}"


def read_peer_name(name: str) -> Optional[PeerName]:
    """A timm or Hugging Face model name read (None when it is neither); an unknown timm tag
    raises ValueError naming the ones vitlab reads."""
    m = _TIMM.match(name.strip())
    if m:
        size, patch, depth, stride, res, tag = m.groups()
        letter, res = TIMM_SIZES[size], int(res)
        step = int(patch or stride)
        variant = f"R{depth}+ViT-{letter}/{step}" if depth else f"ViT-{letter}/{step}"
        tag = tag or TIMM_DEFAULT_TAGS.get((letter, step, res, int(depth or 0)), TIMM_TAG)
        classes = tag_classes(tag)
        if classes is None:
            raise ValueError(f"timm tag {tag!r} of {name!r}: vitlab reads tags ending in in1k or in21k "
                             f"(e.g. {name.split('.')[0]}.{TIMM_TAG})")
        base = name.split(".")[0]
        if res % step:  # vit_tiny_patch16_22 is a typing slip, not a 22 px model
            near = suggest.hint(base, [f"{base.rsplit('_', 1)[0]}_{r}" for r in (224, 384) if r % step == 0])
            raise ValueError(f"timm name {name!r}: {res} px is not a whole number of {step} px patches{near}")
        changes = {**timm_preprocessing(res), "image_size": res, "num_classes": classes}
        return PeerName("timm", variant, changes, f"timm:{base}.{tag}")
    m = _HF.match(name.strip())
    if m:
        size, patch, res, in21k = m.groups()
        changes = {**HF_NUMERICS, **HF_PREPROCESSING, "image_size": int(res), "num_classes": 0 if in21k else 1000}
        return PeerName("Hugging Face", f"ViT-{HF_SIZES[size]}/{patch}", changes, f"hf-hub:{name.strip()}")
    return None

