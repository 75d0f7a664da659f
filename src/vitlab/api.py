"""The Python API in one place: create_model, list_models, load, save, transform.

    model = vitlab.load("hf-hub:google/vit-base-patch16-224")   # or a path, timm:NAME, MODEL:WEIGHTS
    preprocess = vitlab.transform(model)                          # PIL image -> normalised tensor
    logits = model(preprocess(image)[None])
"""

from __future__ import annotations

import fnmatch
import os
from typing import Any, Callable, Optional

import torch

from vitlab import checkpoints
from vitlab.checkpoints import hub, pretrained as registry, share
from vitlab.checkpoints.peers import read_peer_name, timm_name, variant_config
from vitlab.config import BiTConfig, ConfigError, ModelConfig, ViTConfig, model_flops
from vitlab.data.transforms import model_transform
from vitlab.models import Model, build
from vitlab.models.variants import MODELS


def _check_type(function: str, argument: str, value: Any, types: Any, what: str) -> None:
    """A TypeError from vitlab, naming the argument and what to pass, before anything deeper
    meets a value of the wrong type (`create_model(None)`)."""
    if not isinstance(value, types) or (bool not in (types if isinstance(types, tuple) else (types,)) and isinstance(value, bool)):
        raise TypeError(f"vitlab.{function}: {argument} must be {what}, not {type(value).__name__} {value!r:.60}")


def list_models(pattern: Optional[str] = None, pretrained: bool = False) -> list[str]:
    """The registered variant names in the paper's notation ("ViT-B/16"), or with
    `pretrained=True` the published checkpoints by name ("ViT-B/16:imagenet21k"); `pattern`
    filters them, shell-style and ignoring case: `list_models("ViT-B*", pretrained=True)`."""
    _check_type("list_models", "pattern", pattern, (str, type(None)), "a shell-style pattern such as 'ViT-B*'")
    names = registry.list_pretrained() if pretrained else list(MODELS)
    try:
        peer = read_peer_name(pattern) if pattern else None
    except ValueError:
        peer = None
    if peer is not None and not pretrained:  # timm's or HF's name of a variant: that variant
        pattern = peer.variant
    if pattern is None:
        return names
    def matches(n: str) -> bool:  # the paper's notation, or timm's name for the variant ('vit_tiny*')
        spellings = [n, *([timm_name(n.split(":")[0]) or ""] if not n.startswith("timm:") else [])]
        return any(fnmatch.fnmatch(s.lower(), pattern.lower()) for s in spellings if s)
    return [n for n in names if matches(n)]


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """A variant's config with fields changed; a changed shape is named as such (see variant_config)."""
    _check_type("get_config", "name", name, str, "a variant name such as 'ViT-B/16' (vitlab.list_models())")
    return variant_config(name, **overrides)


def default_weights(name: str) -> str:
    """The checkpoint `create_model(MODEL, pretrained=True)` loads: the paper's ImageNet-21k
    pre-training (§4.1) where it was published, else AugReg's."""
    for kind in ("imagenet21k", "augreg-in21k"):
        if f"{name}:{kind}" in registry.PRETRAINED:
            return f"{name}:{kind}"
    have = sorted({e.model for e in registry.PRETRAINED.values()})
    raise ConfigError(f"no published weights for {name}; pretrained=True works for {', '.join(have)}")


def create_model(name: str | ModelConfig, pretrained: bool = False, **overrides: Any) -> Model:
    """A freshly initialised model: `create_model("ViT-B/16", num_classes=10, image_size=384)`,
    `create_model("BiT-R50x1", num_classes=10)`, or by timm's or Hugging Face's name
    (`create_model("vit_tiny_patch16_224")`: ViT-Ti/16 with timm's numerics and preprocessing).

    `pretrained=True` loads published weights instead: a variant's default ones
    (`default_weights`), or a checkpoint name ("ViT-B/16:augreg-in21k", "timm:...",
    "hf-hub:..."); the overrides then apply as in `load`.
    """
    _check_type("create_model", "name", name, (str, ViTConfig, BiTConfig),
                "a variant name such as 'ViT-B/16' (vitlab.list_models()) or a ViTConfig/BiTConfig")
    _check_type("create_model", "pretrained", pretrained, bool, "True or False")
    if pretrained:
        if isinstance(name, (ViTConfig, BiTConfig)):
            raise ConfigError("pretrained=True needs a model or checkpoint name, not a config")
        peer = read_peer_name(name)
        if peer is not None:  # timm's tag (or its default one) and a Hugging Face name select the weights
            name = peer.weights
        elif not hub.is_pretrained_name(name):
            name = default_weights(get_config(name).name)
        return load(name, **overrides)
    if isinstance(name, str) and hub.is_pretrained_name(name) and read_peer_name(name) is None:  # a peer's: its architecture
        raise ConfigError(f"{name!r} names weights; pass pretrained=True to load them, or a variant name for a fresh model")
    cfg = name.replace(**overrides) if isinstance(name, (ViTConfig, BiTConfig)) else get_config(name, **overrides)
    return build(cfg)


def load(path_or_name: str | os.PathLike, format: Optional[str] = None, revision: Optional[str] = None,
         **overrides: Any) -> Model:
    """Load a checkpoint in any known format, or by name from the Hugging Face Hub:

    - a path: a vitlab .safetensors, an official .npz, a timm or torchvision state dict, a
      transformers `save_pretrained` folder, a timm Hub folder;
    - `hf-hub:ORG/NAME[@REVISION]`, e.g. "hf-hub:google/vit-base-patch16-224";
    - `timm:NAME`, e.g. "timm:vit_base_patch16_224.augreg2_in21k_ft_in1k";
    - `MODEL:WEIGHTS` from the registry, e.g. "ViT-B/16:imagenet21k" (`list_models(pretrained=True)`).

    Names go through huggingface_hub: its cache, $HF_HUB_OFFLINE, `revision=` pinning, the
    token in $HF_TOKEN. Overrides change the config on the way in: `image_size=384` resizes
    the position embeddings, `num_classes=10` starts a fresh zero-initialised head. The model
    keeps its preprocessing (mean, std, crop) in its config: `vitlab.transform(model)`.
    """
    _check_type("load", "path_or_name", path_or_name, (str, os.PathLike),
                "a checkpoint path or a name such as 'ViT-B/16:imagenet21k'")
    _check_type("load", "format", format, (str, type(None)), "a format name (vitlab.checkpoints.FORMATS) or None")
    _check_type("load", "revision", revision, (str, type(None)), "a branch, tag or commit, or None")
    return checkpoints.load(path_or_name, format, revision, **overrides)


def save(model: Model, path: str | os.PathLike, format: str = "vitlab", **kwargs: Any) -> None:
    """Write `model` to `path` in one of the formats in `vitlab.checkpoints.FORMATS`, or
    upload it to the Hub with `path="hf-hub:ORG/NAME"` (a transformers folder with timm's
    weights beside them and a model card; kwargs go to `vitlab.checkpoints.share.push`)."""
    _check_type("save", "model", model, torch.nn.Module, "a vitlab model (vitlab.create_model or vitlab.load)")
    _check_type("save", "path", path, (str, os.PathLike), "a file or folder path, or 'hf-hub:ORG/NAME'")
    _check_type("save", "format", format, str, "a format name (vitlab.checkpoints.FORMATS)")
    if isinstance(path, str) and path.startswith(hub.HF_PREFIX):
        share.push(model, path, **kwargs)
        return
    checkpoints.save(model, path, format, **kwargs)


def transform(model_or_config: Model | ModelConfig, train: bool = False, **augment: Any) -> Callable:
    """The preprocessing the model expects, PIL image (or uint8 (C, H, W) tensor) in,
    normalised float tensor out.

    Evaluation (`train=False`): resize to image_size / crop_fraction (both sides, or the
    shorter one for crop_mode "center") with the model's resize backend (PIL, or
    torchvision's kernels on a uint8 tensor for a Hugging Face checkpoint), centre-crop
    image_size, scale to [0, 1], normalise with the model's mean and std. The same numbers as
    timm's `create_transform(**resolve_data_config(model=...))` and transformers' image
    processor for the same weights, and the pixels every vitlab command feeds the model;
    `print(vitlab.transform(model))` says what it does.
    Training (`train=True`): the paper's inception crop and flip at the same size,
    interpolation and normalisation; `augment` takes train_transform's options (randaugment=2, ...).
    """
    cfg = getattr(model_or_config, "config", model_or_config)
    if not isinstance(cfg, (ViTConfig, BiTConfig)):
        raise TypeError(f"vitlab.transform takes a vitlab model or its config, not {type(model_or_config).__name__}")
    return model_transform(cfg, train, **augment)


def model_table(image_size: Optional[int] = None, num_classes: Optional[int] = None,
                pattern: Optional[str] = None) -> list[dict[str, Any]]:
    """One row per registered variant (what `vitlab models` prints): its shape, parameters and
    GFLOPs at `image_size` (default: its own) with `num_classes` classes; only the names that
    match `pattern` (as list_models). Built on the meta device: shapes only, no memory."""
    out = []
    overrides: dict[str, Any] = {k: v for k, v in (("image_size", image_size or None), ("num_classes", num_classes)) if v is not None}
    for name in list_models(pattern):
        with torch.device("meta"):  # shapes only: no memory, no initialisation cost
            model = create_model(name, **overrides)
        cfg = model.config
        out.append(
            {
                "name": name,
                "kind": cfg.kind,
                "image_size": f"{cfg.image_size[0]}x{cfg.image_size[1]}",
                "width": cfg.hidden_size if isinstance(cfg, ViTConfig) else cfg.feature_dim,
                "depth": cfg.depth,
                "heads": cfg.num_heads if isinstance(cfg, ViTConfig) else None,
                "mlp": cfg.mlp_dim if isinstance(cfg, ViTConfig) else None,
                "tokens": cfg.num_tokens if isinstance(cfg, ViTConfig) else None,
                "classes": cfg.num_classes,
                "params": sum(p.numel() for p in model.parameters()),
                "gflops": model_flops(cfg) / 1e9,
            }
        )
    return out
