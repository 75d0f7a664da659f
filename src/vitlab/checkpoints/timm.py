"""timm `VisionTransformer` state dicts (plain ViTs and the R50+ViT hybrids), both ways; timm's
BiT ResNets (`resnetv2_*_bit`) go through the same reader and writer with bit.py's table.

timm's names are close to vitlab's; the table is mostly copies. What differs is numerics:
timm uses exact GELU, LayerNorm eps 1e-6, bicubic position-embedding resizing, and in its
hybrids `StdConv2dSame(eps=1e-8)` — (w - mean) / sqrt(var + 1e-8) — with GroupNorm eps 1e-5
(timm/models/vision_transformer_hybrid.py `_resnetv2`, timm/layers/std_conv.py). The importer
records exactly these in the config.

A state dict does not say how many heads the attention has; the published widths have known
counts (see tables.KNOWN_HEADS), other widths get heads of 64 — override with
`vitlab.load(path, num_heads=N)`. Files vitlab writes carry the full config in their
metadata, so they read back exactly. `timm_model_args(config)` / `create_timm_model(config)`
give the timm model that computes what the vitlab model computes, carrying a
`pretrained_cfg` (mean, std, crop, input size, interpolation) so that timm's
`resolve_data_config` preprocesses as the vitlab model expects.

A folder in timm's Hub layout (config.json with "architecture" and "pretrained_cfg", beside
model.safetensors or pytorch_model.bin: what `timm:NAME` fetches) reads as this format too;
its pretrained_cfg sets the config's mean, std, crop and interpolation, and its label names
(ImageNet synsets, or names) the class names. `hub_config(model)` writes that config.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from vitlab import suggest
from vitlab.checkpoints import bit
from vitlab.checkpoints.io import CheckpointError, Imported
from vitlab.checkpoints.labels import imagenet_names, imagenet_synsets
from vitlab.checkpoints.peers import timm_numerics, timm_preprocessing
from vitlab.checkpoints.tables import (
    Rule,
    check_carried,
    config_json,
    copy,
    count_indexed,
    export_state,
    failing,
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
from vitlab.config import BiTConfig, ModelConfig, ResNetConfig, ViTConfig
from vitlab.extras import require
from vitlab.models.variants import describe

FORMAT_NAME = "timm"
BACKBONE = "patch_embed.backbone."


# The table ------------------------------------------------------------------------------
def rules(cfg: ViTConfig) -> list[Rule]:
    # The same names but one: timm's position embedding is a bare tensor.
    same = ["patch_embed.proj.weight", "patch_embed.proj.bias", "pos_embed", "norm.weight", "norm.bias"]
    if cfg.has_class_token:
        same.append("cls_token")
    for i in range(cfg.depth):
        for n in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"):
            same += [f"blocks.{i}.{n}.{p}" for p in ("weight", "bias") if not (n == "attn.qkv" and p == "bias" and not cfg.qkv_bias)]
    if cfg.num_classes:
        same += ["head.weight", "head.bias"]
    table = [copy("pos_embed.pos_embedding" if k == "pos_embed" else k, k) for k in same]
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
    if path.is_dir():
        return folder_config(path) is not None and _folder_weights(path) is not None
    keys = peek_keys(path)
    return keys is not None and (looks_like(keys) or bit.is_timm(keys))


# timm's Hub layout ------------------------------------------------------------------------
FOLDER_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")


def folder_config(folder: Path) -> Optional[dict[str, Any]]:
    """A timm config.json (an "architecture" and its pretrained_cfg), or None."""
    c = config_json(folder, "timm config")
    return c if c is not None and "architecture" in c else None


def _folder_weights(folder: Path) -> Optional[Path]:
    c = folder_config(folder) or {}
    names = ((c.get("pretrained_cfg") or {}).get("hf_hub_filename"), *FOLDER_WEIGHTS)
    return next((folder / n for n in names if n and (folder / n).is_file()), None)


def preprocessing_from(pcfg: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
    """Config changes from a timm pretrained_cfg: mean, std, crop and resize interpolation.
    timm's "border" crop mode has no vitlab equivalent and reads as "center"."""
    changes: dict[str, Any] = {}
    if pcfg.get("mean") and len(pcfg["mean"]) == cfg.in_channels:
        changes["mean"], changes["std"] = tuple(pcfg["mean"]), tuple(pcfg["std"])
    if pcfg.get("crop_pct"):
        changes["crop_fraction"] = float(pcfg["crop_pct"])
    changes["crop_mode"] = "squash" if pcfg.get("crop_mode") == "squash" else "center"
    if pcfg.get("interpolation") in INTERPOLATIONS:
        changes["interpolation"] = pcfg["interpolation"]
    return changes


def label_names_from(pcfg: dict[str, Any], num_classes: int) -> Optional[list[str]]:
    """timm's label_names: ImageNet synsets (named with vitlab's ImageNet names) or names."""
    names = pcfg.get("label_names")
    if not isinstance(names, list) or len(names) != num_classes:
        return None
    if names == imagenet_synsets(num_classes):
        return imagenet_names(num_classes)
    return [str(n) for n in names]


def read_folder(folder: Path) -> Imported:
    c = folder_config(folder)
    weights = _folder_weights(folder)
    if c is None or weights is None:
        raise CheckpointError(f"{folder}: not a timm Hub folder (config.json with 'architecture', and {' or '.join(FOLDER_WEIGHTS)})")
    imported = read(weights)
    pcfg = c.get("pretrained_cfg") or {}
    interpolation = pcfg.get("interpolation")
    if interpolation not in (None, "", *INTERPOLATIONS):  # never the default filter without a word
        raise CheckpointError(f"{folder / 'config.json'}: pretrained_cfg.interpolation={interpolation!r} is not one of "
                              f"{', '.join(INTERPOLATIONS)}{suggest.hint(str(interpolation), list(INTERPOLATIONS))}")
    changes = preprocessing_from(pcfg, imported.config)
    heads = (c.get("model_args") or {}).get("num_heads")
    if heads and "vitlab.config" not in imported.metadata:
        changes["num_heads"] = int(heads)  # the state dict cannot say; the stored arguments can
    imported.config = imported.config.replace(**changes)
    imported.class_names = imported.class_names or label_names_from(pcfg, imported.config.num_classes)
    return imported


def infer_config(s: dict, source: str) -> ViTConfig:
    if not looks_like(set(s)):
        raise CheckpointError(f"{source}: not a timm VisionTransformer state dict; found {', '.join(sorted(s)[:6])}")
    if "fc_norm.weight" in s:
        raise CheckpointError(f"{source}: has timm's fc_norm (LayerNorm after pooling), which vitlab's GAP (the paper's) lacks")
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
        raise CheckpointError(f"{source}: pos_embed has no class-token row (timm's no_embed_class=True), which vitlab cannot represent")
    side = square_grid(tokens - int(token), source)
    cfg = ViTConfig(name="timm", image_size=side * p * (resnet.stride if resnet else 1), patch_size=p, in_channels=cin,
                    hidden_size=d, depth=depth, num_heads=guess_num_heads(d), mlp_dim=s["blocks.0.mlp.fc1.weight"].shape[0],
                    num_classes=s["head.weight"].shape[0] if "head.weight" in s else 0,
                    classifier="token" if token else "gap", qkv_bias="blocks.0.attn.qkv.bias" in s, resnet=resnet,
                    mean=(0.5,) * cin, std=(0.5,) * cin)  # one per channel; timm's defaults replace them below
    # A state dict names no preprocessing: timm's default for the architecture (its
    # pretrained_cfg), what timm's own resolve_data_config gives the same model.
    cfg = timm_numerics(cfg).replace(**default_preprocessing(cfg))
    return cfg.replace(name=describe(cfg))


def default_preprocessing(cfg: ViTConfig) -> dict[str, Any]:
    """timm's pretrained_cfg preprocessing for a ViT of this resolution and channel count."""
    changes = timm_preprocessing(cfg.image_size[0])
    changes["mean"], changes["std"] = (changes["mean"][0],) * cfg.in_channels, (changes["std"][0],) * cfg.in_channels
    return changes


def read(path: str | os.PathLike) -> Imported:
    if Path(path).is_dir():
        return read_folder(Path(path))
    return read_state_dict_file(path, FORMAT_NAME, _table, _infer)


def _table(cfg: ModelConfig) -> list[Rule]:
    return bit.timm_rules(cfg) if isinstance(cfg, BiTConfig) else rules(cfg)


def _infer(state: dict, source: str) -> ModelConfig:
    return bit.config_from_timm(state, source) if bit.is_timm(state) else infer_config(state, source)


# Writing --------------------------------------------------------------------------------
def check_writable(cfg: ViTConfig, allow_numerics_change: bool = False) -> list[str]:
    """Refuse what timm cannot represent; returns the numerics changes that were allowed."""
    r = cfg.resnet
    return refuse("timm", failing(
        (cfg.pos_embed != "learned", f"pos_embed={cfg.pos_embed!r} (timm's VisionTransformer has a learned 1D table)"),
        (cfg.representation_size, f"representation_size={cfg.representation_size} (timm's VisionTransformer has no pre-logits layer)"),
    ), failing((r and r.ws_mode != "var", r and f"ResNet ws_mode={r.ws_mode!r}: (w-mean)/(std+eps) (timm's StdConv2dSame computes "
                "(w-mean)/sqrt(var+eps))")), allow_numerics_change)


def write(model, path: str | os.PathLike, allow_numerics_change: bool = False) -> None:
    """A timm state dict: `.safetensors` (with vitlab's config, the timm constructor
    arguments and pretrained_cfg in the metadata) or, for any other suffix, a `torch.save`
    state dict (which has no place for class names or preprocessing)."""
    cfg = model.config
    if isinstance(cfg, BiTConfig):
        bit.check_writable(cfg, "timm", allow_numerics_change)
    else:
        numerics = check_writable(cfg, allow_numerics_change=True)  # refused below, with what the file loses
    theirs = export_state(_table(cfg), model.state_dict(), f"{path} (timm)")
    if not isinstance(cfg, BiTConfig):
        # A torch.save file holds the tensors and nothing else: a reader infers the config from them.
        back = cfg if Path(path).suffix == ".safetensors" else infer_config(theirs, str(path))
        check_carried(f"{path} ({'timm' if back is cfg else 'a timm state dict'})", cfg, back, allow_numerics_change,
                      numerics)
    meta = writer_metadata(model, FORMAT_NAME)
    meta["timm.model_args"] = json.dumps(timm_model_args(cfg))
    meta["timm.pretrained_cfg"] = json.dumps(pretrained_cfg(cfg))
    write_tensors(path, theirs, meta)


def pretrained_cfg(cfg: ModelConfig) -> dict[str, Any]:
    """timm's description of the preprocessing (what `resolve_data_config` reads)."""
    return {
        "input_size": [cfg.in_channels, *cfg.image_size], "fixed_input_size": not getattr(cfg, "dynamic_image_size", False),
        "interpolation": cfg.interpolation, "crop_pct": cfg.crop_fraction, "crop_mode": cfg.crop_mode,
        "mean": list(cfg.mean), "std": list(cfg.std), "num_classes": cfg.num_classes,
        # timm's names of the first convolution and the classifier of its ViT and ResNetV2
        "first_conv": "stem.conv" if isinstance(cfg, BiTConfig) else "patch_embed.proj",
        "classifier": "head.fc" if isinstance(cfg, BiTConfig) else "head",
    }


def hub_config(model, weights_file: str = "model.safetensors") -> dict[str, Any]:
    """timm's config.json for a Hub repo of this model: `timm.create_model("hf-hub:ORG/NAME",
    pretrained=True)` rebuilds it from the stored arguments (a plain ViT; LayerNorm eps 1e-6,
    timm's own) and reads `weights_file`."""
    cfg = model.config
    args = timm_model_args(cfg)
    if args.pop("layer_norm_eps") != 1e-6 or args.pop("resnet", None) is not None:
        raise CheckpointError("timm's Hub loader builds plain ViTs with LayerNorm eps 1e-6; this model is not one")
    pcfg = pretrained_cfg(cfg)
    if weights_file != "model.safetensors":
        pcfg["hf_hub_filename"] = weights_file
    if model.class_names:
        pcfg["label_names"] = list(model.class_names)
    return {"architecture": "vit_base_patch16_224",  # a registered constructor; model_args sets every size
            "num_classes": cfg.num_classes, "num_features": cfg.hidden_size, "global_pool": args["global_pool"],
            "model_args": args, "pretrained_cfg": pcfg}


def timm_model_args(cfg: ModelConfig) -> dict[str, Any]:
    """JSON-able keyword arguments of timm's VisionTransformer (or ResNetV2, for a BiT ResNet)
    for this architecture. The LayerNorm epsilon and a hybrid's backbone are objects:
    `create_timm_model` adds them."""
    if isinstance(cfg, BiTConfig):
        return bit.timm_model_args(cfg)
    args: dict[str, Any] = {
        "img_size": list(cfg.image_size), "patch_size": cfg.patch_size, "in_chans": cfg.in_channels,
        "embed_dim": cfg.hidden_size, "depth": cfg.depth, "num_heads": cfg.num_heads, "mlp_ratio": cfg.mlp_dim / cfg.hidden_size,
        "qkv_bias": cfg.qkv_bias, "num_classes": cfg.num_classes, "class_token": cfg.has_class_token,
        "global_pool": "token" if cfg.has_class_token else "avg",
        "fc_norm": False,  # normalise the tokens, then pool (the paper's GAP, App. D.3)
        "act_layer": "gelu" if cfg.gelu == "exact" else "gelu_tanh",
    }
    if cfg.resnet is not None:
        r = cfg.resnet
        args["resnet"] = {"layers": list(r.layers), "width_factor": r.width_factor, "ws_eps": r.ws_eps, "gn_eps": r.gn_eps,
                          "gn_groups": r.gn_groups}
    args["layer_norm_eps"] = cfg.layer_norm_eps
    return args


def create_timm_model(cfg: ModelConfig):
    """A timm VisionTransformer (needs timm) that computes what `VisionTransformer(cfg)` does,
    or the ResNetV2 that computes what `BiTResNet(cfg)` does."""
    if isinstance(cfg, BiTConfig):
        return bit.create_timm_model(cfg)
    from functools import partial

    import torch.nn as nn

    require("peers", "a timm peer model", modules=("timm",))
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
        backbone = ResNetV2(layers=resnet["layers"], num_classes=0, global_pool="", in_chans=cfg.in_channels, preact=False,
                            stem_type="same", width_factor=resnet["width_factor"],
                            conv_layer=partial(StdConv2dSame, eps=resnet["ws_eps"]),
                            norm_layer=partial(GroupNormAct, num_groups=resnet["gn_groups"], eps=resnet["gn_eps"]))
        args["embed_layer"] = partial(HybridEmbed, backbone=backbone)
    model = TimmViT(norm_layer=partial(nn.LayerNorm, eps=eps), **args)
    model.pretrained_cfg = pretrained_cfg(cfg)  # type: ignore[assignment]  # undeclared by timm's class; what timm's resolve_data_config reads
    return model
