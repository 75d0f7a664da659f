"""Named model variants in the paper's notation ("ViT-B/16": Base size, 16x16 patches).

Sizes follow Table 1 (B, L, H) and later work (Ti, S). A hybrid is a base config with a BiT
ResNet in front and patch size 1 on its feature map: three stages of the ResNet give stride
16, four give stride 32, which is what the "/16" or "/32" of the name counts.

The BiT ResNets ("BiT-R50x1": 50 layers, width factor 1) are the paper's baseline (§4.1);
their stage layouts are BiT's (R50 = 3, 4, 6, 3 units; R101 = 3, 4, 23, 3; R152 = 3, 8, 36, 3;
R200 = 3, 24, 36, 3, the layout of He et al. 2016's ResNet-200 that Table 6's ResNet200x3 uses).
Table 6 (the compute study) names its hybrids "R50x1+ViT-B/32": that spelling resolves to
the registered "R50+ViT-B/32".
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from vitlab.config import BiTConfig, ModelConfig, ResNetConfig, ViTConfig

#                  width, depth, heads, mlp
SIZES = {
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
    "H": (1280, 32, 16, 5120),
    # CPU-sized: the CIFAR-scale model of the benchmarks (9 blocks of width 192).
    "C": (192, 9, 3, 384),
}


def _vit(size: str, patch: int, image_size: int = 224, **extra) -> ViTConfig:
    width, depth, heads, mlp = SIZES[size]
    return ViTConfig(
        name=f"ViT-{size}/{patch}",
        image_size=(image_size, image_size),
        patch_size=patch,
        hidden_size=width,
        depth=depth,
        num_heads=heads,
        mlp_dim=mlp,
        **extra,
    )


def _hybrid(name: str, base: ViTConfig, layers: tuple[int, ...]) -> ViTConfig:
    # Patch size 1 on the ResNet map: the map's stride (16 for 3 stages, 32 for 4) is the
    # effective patch size the name reports.
    return replace(base, name=name, patch_size=1, resnet=ResNetConfig(layers=layers))


# BiT's stage layouts by depth (Kolesnikov et al. 2020, and the R26 of the paper's hybrids).
BIT_LAYERS = {26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3), 200: (3, 24, 36, 3)}


def _bit(depth: int, width_factor: int, **extra) -> BiTConfig:
    return BiTConfig(name=f"BiT-R{depth}x{width_factor}", layers=BIT_LAYERS[depth], width_factor=width_factor, **extra)


MODELS: dict[str, ModelConfig] = {
    "ViT-Ti/16": _vit("Ti", 16),
    "ViT-S/16": _vit("S", 16),
    "ViT-S/32": _vit("S", 32),
    "ViT-B/32": _vit("B", 32),
    "ViT-B/16": _vit("B", 16),
    "ViT-B/8": _vit("B", 8),
    "ViT-L/32": _vit("L", 32),
    "ViT-L/16": _vit("L", 16),
    "ViT-H/14": _vit("H", 14),
    # Hybrids (§3.1, §4.1). R50 with stage 4 folded into stage 3 (3, 4, 9) gives /16.
    "R50+ViT-B/16": _hybrid("R50+ViT-B/16", _vit("B", 16), (3, 4, 9)),
    "R50+ViT-L/32": _hybrid("R50+ViT-L/32", _vit("L", 32), (3, 4, 6, 3)),
    # Table 6's other hybrids: the /32 one reads R50's stage-4 output (stride 32), the /16 one
    # folds stage 4 into stage 3 as R50+ViT-B/16 does (stride 16).
    "R50+ViT-B/32": _hybrid("R50+ViT-B/32", _vit("B", 32), (3, 4, 6, 3)),
    "R50+ViT-L/16": _hybrid("R50+ViT-L/16", _vit("L", 16), (3, 4, 9)),
    "R26+ViT-S/32": _hybrid("R26+ViT-S/32", _vit("S", 32), (2, 2, 2, 2)),
    # Small models for 32x32 images (CIFAR) that train on a laptop CPU.
    "ViT-Ti/4": _vit("Ti", 4, image_size=32, num_classes=10),
    "ViT-S/4": _vit("S", 4, image_size=32, num_classes=10),
    "ViT-C/4": _vit("C", 4, image_size=32, num_classes=10),
    # A hybrid of the same size for 32 px: one ResNet stage (stride 4, an 8x8 map) under
    # ViT-C, so it sees as many tokens as ViT-C/4 does.
    "R8+ViT-C/4": replace(_vit("C", 4, image_size=32, num_classes=10), name="R8+ViT-C/4", patch_size=1,
                          resnet=ResNetConfig(layers=(2,))),
    # BiT ResNets (§4.1): the published sizes, at 224 px with 1000 classes.
    "BiT-R50x1": _bit(50, 1),
    "BiT-R101x1": _bit(101, 1),
    "BiT-R50x3": _bit(50, 3),
    "BiT-R101x3": _bit(101, 3),
    "BiT-R152x2": _bit(152, 2),
    "BiT-R152x4": _bit(152, 4),
    "BiT-R26x1": _bit(26, 1),
    # The rest of Table 6's ResNets (the compute study): ResNet50x2, ResNet152x1, ResNet200x3.
    "BiT-R50x2": _bit(50, 2),
    "BiT-R152x1": _bit(152, 1),
    "BiT-R200x3": _bit(200, 3),
    # CPU-sized for 32 px: R26 at half width with a 3x3/1 stem, about the FLOPs of ViT-C/4.
    "BiT-R26-C": BiTConfig(name="BiT-R26-C", image_size=(32, 32), layers=BIT_LAYERS[26], base_width=32,
                           stem="cifar", num_classes=10),
}


# The fields that make a variant what it is; changing one makes another model.
SHAPE = {"hidden_size": "width", "depth": "depth", "num_heads": "heads", "mlp_dim": "mlp", "patch_size": "patch"}
BIT_SHAPE = {"layers": "layers", "width_factor": "width factor", "base_width": "base width", "stem": "stem"}


def with_changes(base: ModelConfig, **changes: Any) -> ModelConfig:
    """A variant with some fields changed. A change to its shape (width, depth, heads, MLP
    size, patch; a BiT ResNet's layers and widths) makes another model, and the name says so:
    "ViT-Ti/4 (custom: width 64, depth 4)" -- in logs, summaries, checkpoints and `vitlab info`
    alike. A name becomes its variant in checkpoints/peers.py (`variant_config`), which also
    reads timm's and Hugging Face's names for them."""
    cfg = base.replace(**changes)
    if "name" not in changes:
        cfg = cfg.replace(name=describe(cfg, base))
    return cfg


def _shape_fields(cfg: ModelConfig) -> dict[str, str]:
    return BIT_SHAPE if isinstance(cfg, BiTConfig) else SHAPE


def _shape(cfg: ModelConfig) -> tuple:
    stem = cfg.resnet.layers if isinstance(cfg, ViTConfig) and cfg.resnet else None
    return (cfg.kind, stem, *(getattr(cfg, f) for f in _shape_fields(cfg)))


def describe(cfg: ModelConfig, base: Optional[ModelConfig] = None) -> str:
    """The model's name: a registered variant with the same shape, else `base` (or a generic
    "ViT-D.../..." or "BiT-R..." name) with what differs from it."""
    for name, v in MODELS.items():
        if _shape(v) == _shape(cfg):
            return name
    if base is None:
        if isinstance(cfg, BiTConfig):
            width = f"x{cfg.width_factor}" if cfg.base_width == 64 else f"-w{cfg.root_width}"
            return f"BiT-R{cfg.depth}{width}" + ("-cifar" if cfg.stem == "cifar" else "")
        prefix = f"R{len(cfg.resnet.layers)}stage+" if cfg.resnet else ""
        return f"{prefix}ViT-D{cfg.hidden_size}-L{cfg.depth}/{cfg.total_stride}"
    fields = _shape_fields(cfg)
    diffs = ", ".join(f"{word} {getattr(cfg, f)}" for f, word in fields.items() if getattr(cfg, f) != getattr(base, f))
    return f"{base.name} (custom: {diffs})"


def resolve_name(name: str) -> str:
    """Accept the paper's spelling and a few common variants ("vit-b/16", "ViT-B-16")."""
    if name in MODELS:
        return name
    key = name.strip().lower().replace("_", "-").replace("r50x1+", "r50+")  # Table 6 writes R50x1+ViT-B/32
    for canonical in MODELS:
        spelled = canonical.lower()
        if key in (spelled, spelled.replace("/", "-"), spelled.replace("/", "")):
            return canonical
    raise KeyError(name)
