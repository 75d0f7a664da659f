"""timm `VisionTransformer` state dicts (plain ViTs and the R50+ViT hybrids), both ways.

timm's names are close to vitlab's; the table is mostly copies. What differs is numerics:
timm uses exact GELU, LayerNorm eps 1e-6, bicubic position-embedding resizing, and in its
hybrids `StdConv2dSame(eps=1e-8)` — (w - mean) / sqrt(var + 1e-8) — with GroupNorm eps 1e-5
(timm/models/vision_transformer_hybrid.py `_resnetv2`, timm/layers/std_conv.py). The importer
records exactly these in the config.

A state dict does not say how many heads the attention has; the published widths have known
counts (see tables.KNOWN_HEADS), other widths get heads of 64 — override with
`vitlab.load(path, num_heads=N)`. Files vitlab writes carry the full config in their
metadata, so they read back exactly. `timm_model_args(config)` / `create_timm_model(config)`
give the timm model that computes what the vitlab model computes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vitlab.checkpoints.io import CheckpointError, Imported
from vitlab.checkpoints.tables import (
    Rule,
    copy,
    count_indexed,
    export_state,
    guess_num_heads,
    peek_keys,
    read_state_dict_file,
    refuse,
    resnet_layers,
    resnet_rules,
    square_grid,
    write_tensors,
    writer_metadata,
)
from vitlab.config import ResNetConfig, ViTConfig
from vitlab.models.variants import describe

FORMAT_NAME = "timm"
BACKBONE = "patch_embed.backbone."


def timm_numerics(cfg: ViTConfig) -> ViTConfig:
    resnet = cfg.resnet
    if resnet is not None:
        resnet = ResNetConfig(layers=resnet.layers, width_factor=resnet.width_factor, ws_eps=1e-8, ws_mode="var", gn_eps=1e-5)
    return cfg.replace(gelu="exact", layer_norm_eps=1e-6, resize_mode="bicubic", resnet=resnet)


# The table ------------------------------------------------------------------------------
def rules(cfg: ViTConfig) -> list[Rule]:
    table = [
        copy("patch_embed.proj.weight", "patch_embed.proj.weight"),
        copy("patch_embed.proj.bias", "patch_embed.proj.bias"),
        copy("pos_embed.pos_embedding", "pos_embed"),
        copy("norm.weight", "norm.weight"),
        copy("norm.bias", "norm.bias"),
    ]
    if cfg.has_class_token:
        table.append(copy("cls_token", "cls_token"))
    for i in range(cfg.depth):
        b = f"blocks.{i}."
        names = ["norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"]
        for n in names:
            for p in ("weight", "bias"):
                if n == "attn.qkv" and p == "bias" and not cfg.qkv_bias:
                    continue
                table.append(copy(f"{b}{n}.{p}", f"{b}{n}.{p}"))
    if cfg.num_classes:
        table += [copy("head.weight", "head.weight"), copy("head.bias", "head.bias")]
    if cfg.resnet is not None:
        table += resnet_rules(cfg.resnet.layers, _resnet_name, copy, ("weight", "bias"))
    return table


def _resnet_name(part: str, s: int = 0, u: int = 0, n: int = 0) -> str:
    unit = f"{BACKBONE}stages.{s}.blocks.{u}."
    return {
        "root_conv": BACKBONE + "stem.conv.weight", "root_norm": BACKBONE + "stem.norm.",
        "conv": f"{unit}conv{n}.weight", "norm": f"{unit}norm{n}.",
        "proj_conv": unit + "downsample.conv.weight", "proj_norm": unit + "downsample.norm.",
    }[part]


# Reading --------------------------------------------------------------------------------
def looks_like(keys: set[str]) -> bool:
    """timm's names: a bare `pos_embed` tensor (vitlab's is `pos_embed.pos_embedding`)."""
    return "patch_embed.proj.weight" in keys and "pos_embed" in keys and "blocks.0.attn.qkv.weight" in keys


def detect(path: Path) -> bool:
    keys = peek_keys(path)
    return keys is not None and looks_like(keys)


def infer_config(s: dict, source: str) -> ViTConfig:
    if not looks_like(set(s)):
        raise CheckpointError(
            f"{source}: not a timm VisionTransformer state dict (no patch_embed.proj.weight / pos_embed / "
            f"blocks.0.attn.qkv.weight); found {', '.join(sorted(s)[:6])}"
        )
    if "fc_norm.weight" in s:
        raise CheckpointError(
            f"{source}: has fc_norm (timm's LayerNorm after pooling, fc_norm=True); vitlab's GAP normalises "
            "the tokens before pooling, as the paper does, and cannot represent it"
        )
    d, cin, p, _ = s["patch_embed.proj.weight"].shape
    depth = count_indexed(s, lambda i: f"blocks.{i}.norm1.weight")
    resnet = None
    if BACKBONE + "stem.conv.weight" in s:
        width, cin = s[BACKBONE + "stem.conv.weight"].shape[:2]
        layers = resnet_layers(s, lambda st, u: _resnet_name("conv", st, u, 1))
        resnet = ResNetConfig(layers=layers, width_factor=width // 64)
    token = "cls_token" in s
    tokens = s["pos_embed"].shape[1]
    if token and round(tokens**0.5) ** 2 == tokens and round((tokens - 1) ** 0.5) ** 2 != tokens - 1:
        raise CheckpointError(
            f"{source}: pos_embed has no class-token row (timm's no_embed_class=True); vitlab adds a position "
            "embedding to the class token, as the paper does, and cannot represent it"
        )
    side = square_grid(tokens - int(token), source)
    cfg = ViTConfig(
        name="timm",
        image_size=side * p * (resnet.stride if resnet else 1),
        patch_size=p,
        in_channels=cin,
        hidden_size=d,
        depth=depth,
        num_heads=guess_num_heads(d),
        mlp_dim=s["blocks.0.mlp.fc1.weight"].shape[0],
        num_classes=s["head.weight"].shape[0] if "head.weight" in s else 0,
        classifier="token" if token else "gap",
        qkv_bias="blocks.0.attn.qkv.bias" in s,
        resnet=resnet,
        mean=(0.5,) * cin,
        std=(0.5,) * cin,
    )
    cfg = timm_numerics(cfg)
    return cfg.replace(name=describe(cfg))


def read(path: str | os.PathLike) -> Imported:
    return read_state_dict_file(path, FORMAT_NAME, rules, infer_config)


# Writing --------------------------------------------------------------------------------
def check_writable(cfg: ViTConfig, allow_numerics_change: bool = False) -> None:
    features, numerics = [], []
    if cfg.pos_embed != "learned":
        features.append(f"pos_embed={cfg.pos_embed!r} (timm's VisionTransformer has a learned 1D table)")
    if cfg.representation_size:
        features.append(f"representation_size={cfg.representation_size} (timm's VisionTransformer has no pre-logits layer)")
    if cfg.resnet is not None and cfg.resnet.ws_mode != "var":
        numerics.append(
            f"ResNet ws_mode={cfg.resnet.ws_mode!r}: (w-mean)/(std+eps) (timm's StdConv2dSame computes (w-mean)/sqrt(var+eps))"
        )
    refuse("timm", features, numerics, allow_numerics_change)


def write(model, path: str | os.PathLike, allow_numerics_change: bool = False) -> None:
    """A timm state dict: `.safetensors` (with vitlab's config and the timm constructor
    arguments in the metadata) or, for any other suffix, a `torch.save` state dict."""
    import json

    cfg = model.config
    check_writable(cfg, allow_numerics_change)
    theirs = export_state(rules(cfg), model.state_dict(), f"{path} (timm)")
    meta = writer_metadata(model, FORMAT_NAME)
    meta["timm.model_args"] = json.dumps(timm_model_args(cfg))
    write_tensors(path, theirs, meta)


def timm_model_args(cfg: ViTConfig) -> dict[str, Any]:
    """JSON-able keyword arguments of timm's VisionTransformer for this architecture.
    The LayerNorm epsilon and a hybrid's backbone are objects: `create_timm_model` adds them."""
    args: dict[str, Any] = {
        "img_size": list(cfg.image_size),
        "patch_size": cfg.patch_size,
        "in_chans": cfg.in_channels,
        "embed_dim": cfg.hidden_size,
        "depth": cfg.depth,
        "num_heads": cfg.num_heads,
        "mlp_ratio": cfg.mlp_dim / cfg.hidden_size,
        "qkv_bias": cfg.qkv_bias,
        "num_classes": cfg.num_classes,
        "class_token": cfg.has_class_token,
        "global_pool": "token" if cfg.has_class_token else "avg",
        "fc_norm": False,  # normalise the tokens, then pool (the paper's GAP, App. D.3)
        "act_layer": "gelu" if cfg.gelu == "exact" else "gelu_tanh",
    }
    if cfg.resnet is not None:
        args["resnet"] = {
            "layers": list(cfg.resnet.layers),
            "width_factor": cfg.resnet.width_factor,
            "ws_eps": cfg.resnet.ws_eps,
            "gn_eps": cfg.resnet.gn_eps,
            "gn_groups": cfg.resnet.gn_groups,
        }
    args["layer_norm_eps"] = cfg.layer_norm_eps
    return args


def create_timm_model(cfg: ViTConfig):
    """A timm VisionTransformer (needs timm) that computes what `VisionTransformer(cfg)` does."""
    from functools import partial

    import torch.nn as nn
    from timm.layers import GroupNormAct, HybridEmbed, StdConv2dSame
    from timm.models.resnetv2 import ResNetV2
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    check_writable(cfg)
    args = timm_model_args(cfg)
    eps = args.pop("layer_norm_eps")
    resnet = args.pop("resnet", None)
    if cfg.mlp_dim != int(cfg.hidden_size * args["mlp_ratio"]):
        raise CheckpointError(f"timm cannot build mlp_dim={cfg.mlp_dim} from a ratio of hidden_size={cfg.hidden_size}")
    if resnet is not None:
        backbone = ResNetV2(
            layers=resnet["layers"],
            num_classes=0,
            global_pool="",
            in_chans=cfg.in_channels,
            preact=False,
            stem_type="same",
            width_factor=resnet["width_factor"],
            conv_layer=partial(StdConv2dSame, eps=resnet["ws_eps"]),
            norm_layer=partial(GroupNormAct, num_groups=resnet["gn_groups"], eps=resnet["gn_eps"]),
        )
        args["embed_layer"] = partial(HybridEmbed, backbone=backbone)
    return TimmViT(norm_layer=partial(nn.LayerNorm, eps=eps), **args)
