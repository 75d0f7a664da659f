"""The Python API in one place: create_model, list_models, load, save."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from vitlab.config import BiTConfig, ConfigError, ModelConfig, ViTConfig
from vitlab.models import Model, build
from vitlab.models.variants import MODELS, resolve_name


def list_models() -> list[str]:
    """The registered variant names, in the paper's notation."""
    return list(MODELS)


def get_config(name: str, **overrides: Any) -> ModelConfig:
    try:
        base = MODELS[resolve_name(name)]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None
    return base.replace(**overrides)


def create_model(name: str | ModelConfig, **overrides: Any) -> Model:
    """A freshly initialised model: `create_model("ViT-B/16", num_classes=10, image_size=384)`,
    `create_model("BiT-R50x1", num_classes=10)`."""
    cfg = name.replace(**overrides) if isinstance(name, (ViTConfig, BiTConfig)) else get_config(name, **overrides)
    return build(cfg)


def load(path_or_name: str | os.PathLike, format: Optional[str] = None, **overrides: Any) -> Model:
    """Load a checkpoint in any known format, or a pretrained name such as "ViT-B/16:imagenet21k".

    Overrides change the config on the way in; `image_size=384` resizes the position
    embeddings, `num_classes=10` starts a fresh zero-initialised head.
    """
    from vitlab import checkpoints

    if not Path(path_or_name).exists() and isinstance(path_or_name, str) and ":" in path_or_name:
        from vitlab.checkpoints import pretrained

        path_or_name = pretrained.fetch(path_or_name)
    return checkpoints.load_file(path_or_name, format, **overrides)


def save(model: Model, path: str | os.PathLike, format: str = "vitlab", **kwargs: Any) -> None:
    """Write `model` to `path` in one of the formats in `vitlab.checkpoints.FORMATS`."""
    from vitlab import checkpoints

    checkpoints.save(model, path, format, **kwargs)
