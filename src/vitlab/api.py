"""The Python API in one place: create_model, list_models, load, save."""

from __future__ import annotations

import os
from typing import Any, Optional

from vitlab import checkpoints
from vitlab.config import ViTConfig
from vitlab.models.variants import MODELS, variant_config
from vitlab.models.vit import VisionTransformer


def list_models() -> list[str]:
    """The registered variant names, in the paper's notation."""
    return list(MODELS)


def get_config(name: str, **overrides: Any) -> ViTConfig:
    """A variant's config with fields changed; a changed shape is named as such (see variant_config)."""
    return variant_config(name, **overrides)


def create_model(name: str | ViTConfig, **overrides: Any) -> VisionTransformer:
    """A freshly initialised model: `create_model("ViT-B/16", num_classes=10, image_size=384)`."""
    cfg = name.replace(**overrides) if isinstance(name, ViTConfig) else get_config(name, **overrides)
    return VisionTransformer(cfg)


def load(path_or_name: str | os.PathLike, format: Optional[str] = None, **overrides: Any) -> VisionTransformer:
    """Load a checkpoint in any known format, or a pretrained name such as "ViT-B/16:imagenet21k".

    Overrides change the config on the way in; `image_size=384` resizes the position
    embeddings, `num_classes=10` starts a fresh zero-initialised head.
    """
    return checkpoints.load(path_or_name, format, **overrides)


def save(model: VisionTransformer, path: str | os.PathLike, format: str = "vitlab", **kwargs: Any) -> None:
    """Write `model` to `path` in one of the formats in `vitlab.checkpoints.FORMATS`."""
    checkpoints.save(model, path, format, **kwargs)
