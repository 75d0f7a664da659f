"""torchvision `VisionTransformer` state dicts (`torchvision.models.vit_b_16` and friends).

torchvision's encoder layer uses `nn.MultiheadAttention`, whose `in_proj_weight` is q, k, v
stacked on the output axis with heads major — vitlab's fused qkv exactly, so the table is
all copies. torchvision has exact GELU (not configurable), LayerNorm eps 1e-6, always a class
token and a head, optional `heads.pre_logits` + tanh, and ImageNet mean/std preprocessing
for its own weights. It resizes position embeddings bicubically (with aligned corners, which
vitlab approximates with "bicubic"). Older releases named the MLP `linear_1`/`linear_2`:
both spellings are read.
"""

from __future__ import annotations

import os
from pathlib import Path

from vitlab.checkpoints.io import CheckpointError, Imported
from vitlab.checkpoints.tables import (
    Rule,
    check_carried,
    copy,
    count_indexed,
    export_state,
    failing,
    guess_num_heads,
    peek_keys,
    read_state_dict_file,
    refuse,
    square_grid,
    write_tensors,
    writer_metadata,
)
from vitlab.config import ViTConfig
from vitlab.models.variants import describe

FORMAT_NAME = "torchvision"
LAYER = "encoder.layers.encoder_layer_{}."
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def rules(cfg: ViTConfig) -> list[Rule]:
    table = [copy("cls_token", "class_token"), copy("patch_embed.proj.weight", "conv_proj.weight"),
             copy("patch_embed.proj.bias", "conv_proj.bias"), copy("pos_embed.pos_embedding", "encoder.pos_embedding")]
    table += [copy(f"{a}.{p}", f"{b}.{p}") for a, b in (("norm", "encoder.ln"), ("head", "heads.head")) for p in ("weight", "bias")]
    pairs = [("norm1", "ln_1"), ("attn.proj", "self_attention.out_proj"), ("norm2", "ln_2"), ("mlp.fc1", "mlp.0"),
             ("mlp.fc2", "mlp.3")]
    for i in range(cfg.depth):
        o, t = f"blocks.{i}.", LAYER.format(i)
        table += [copy(o + "attn.qkv.weight", t + "self_attention.in_proj_weight"),
                  copy(o + "attn.qkv.bias", t + "self_attention.in_proj_bias")]
        table += [copy(f"{o}{a}.{p}", f"{t}{b}.{p}") for a, b in pairs for p in ("weight", "bias")]
    if cfg.representation_size:
        table += [copy("pre_logits.weight", "heads.pre_logits.weight"), copy("pre_logits.bias", "heads.pre_logits.bias")]
    return table


def looks_like(keys: set[str]) -> bool:
    return "conv_proj.weight" in keys and "encoder.pos_embedding" in keys


def detect(path: Path) -> bool:
    keys = peek_keys(path)
    return keys is not None and looks_like(keys)


def _current_names(state: dict) -> dict:
    """Old torchvision MLP names (mlp.linear_1/linear_2) -> today's (mlp.0/mlp.3)."""
    return {k.replace(".mlp.linear_1.", ".mlp.0.").replace(".mlp.linear_2.", ".mlp.3."): v for k, v in state.items()}


def infer_config(s: dict, source: str) -> ViTConfig:
    if not looks_like(set(s)):
        raise CheckpointError(f"{source}: not a torchvision VisionTransformer state dict; found {', '.join(sorted(s)[:6])}")
    d, cin, p, _ = s["conv_proj.weight"].shape
    depth = count_indexed(s, lambda i: LAYER.format(i) + "ln_1.weight")
    side = square_grid(s["encoder.pos_embedding"].shape[1] - 1, source)
    rep = s["heads.pre_logits.weight"].shape[0] if "heads.pre_logits.weight" in s else None
    cfg = ViTConfig(name="torchvision", image_size=side * p, patch_size=p, in_channels=cin, hidden_size=d, depth=depth,
                    num_heads=guess_num_heads(d), mlp_dim=s[LAYER.format(0) + "mlp.0.weight"].shape[0],
                    num_classes=s["heads.head.weight"].shape[0], representation_size=rep, gelu="exact", layer_norm_eps=1e-6,
                    resize_mode="bicubic", mean=IMAGENET_MEAN, std=IMAGENET_STD)
    return cfg.replace(name=describe(cfg), **weights_preset(cfg))


# torchvision's ViT builders by (width, patch); their weights carry the preset transform.
ARCHITECTURES = {(768, 16): "ViT_B_16", (768, 32): "ViT_B_32", (1024, 16): "ViT_L_16", (1024, 32): "ViT_L_32",
                 (1280, 14): "ViT_H_14"}


def weights_preset(cfg: ViTConfig) -> dict:
    """The evaluation crop of torchvision's own weights for this architecture and resolution
    (`weights.transforms()`: the shorter side resized by PIL to resize_size, a centre crop of
    crop_size): IMAGENET1K_V1 at 224 px (resize 256, or 242 for ViT-L/16, bilinear), SWAG at
    its own size (bicubic). Nothing for a shape torchvision publishes no weights of."""
    import torchvision.models as tvm

    enum = getattr(tvm, f"{ARCHITECTURES.get((cfg.hidden_size, cfg.patch_size), '')}_Weights", None)
    if enum is None or cfg.num_classes != 1000 or cfg.image_size[0] != cfg.image_size[1]:
        return {}
    for weights in sorted(enum, key=lambda w: w.name != "IMAGENET1K_V1"):  # the default weights first
        preset = weights.transforms()
        crop, resize = preset.crop_size[0], preset.resize_size[0]
        if crop == cfg.image_size[0]:
            return {"crop_fraction": crop / resize, "crop_mode": "center", "resize_backend": "pil",
                    "interpolation": preset.interpolation.value}
    return {}


def read(path: str | os.PathLike) -> Imported:
    return read_state_dict_file(path, FORMAT_NAME, rules, infer_config, rename=_current_names)


def check_writable(cfg: ViTConfig, allow_numerics_change: bool = False) -> list[str]:
    """Refuse what torchvision cannot represent; returns the numerics changes that were allowed."""
    return refuse("torchvision", failing(
        (cfg.classifier != "token", "classifier='gap' (torchvision's ViT always reads a class token)"),
        (cfg.pos_embed != "learned", f"pos_embed={cfg.pos_embed!r} (torchvision has a learned 1D table)"),
        (cfg.resnet is not None, "a ResNet hybrid stem (torchvision has plain ViTs only)"),
        (not cfg.qkv_bias, "qkv_bias=False (nn.MultiheadAttention always has biases)"),
        (cfg.num_classes == 0, "num_classes=0 (torchvision's ViT always has a head)"),
        (cfg.in_channels != 3, f"in_channels={cfg.in_channels} (torchvision's ViT takes RGB)"),
        (cfg.image_size[0] != cfg.image_size[1], f"image_size={cfg.image_size} (torchvision's ViT takes square images)"),
    ), failing((cfg.gelu != "exact", "gelu='tanh' (torchvision's MLP uses exact GELU)")), allow_numerics_change)


def write(model, path: str | os.PathLike, allow_numerics_change: bool = False) -> None:
    """A torchvision state dict (`torch.save`, or `.safetensors` with vitlab's metadata)."""
    cfg = model.config
    numerics = check_writable(cfg, allow_numerics_change=True)  # refused below, with what the file loses
    theirs = export_state(rules(cfg), model.state_dict(), f"{path} (torchvision)")
    # A torch.save file holds the tensors and nothing else: a reader infers the config from them.
    back = cfg if Path(path).suffix == ".safetensors" else infer_config(theirs, str(path))
    check_carried(f"{path} (torchvision)", cfg, back, allow_numerics_change, numerics)
    write_tensors(path, theirs, writer_metadata(model, FORMAT_NAME))


def create_torchvision_model(cfg: ViTConfig):
    """The torchvision VisionTransformer that computes what `VisionTransformer(cfg)` does."""
    from functools import partial

    import torch.nn as nn
    from torchvision.models.vision_transformer import VisionTransformer as TVViT

    check_writable(cfg)
    return TVViT(image_size=cfg.image_size[0], patch_size=cfg.patch_size, num_layers=cfg.depth, num_heads=cfg.num_heads,
                 hidden_dim=cfg.hidden_size, mlp_dim=cfg.mlp_dim, num_classes=cfg.num_classes,
                 representation_size=cfg.representation_size, norm_layer=partial(nn.LayerNorm, eps=cfg.layer_norm_eps))
