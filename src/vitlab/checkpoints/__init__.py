"""Reading and writing checkpoints in every format vitlab knows.

Each format is a module with `detect(path) -> bool`, `read(path) -> Imported` and
`write(model, path)`. FORMATS lists them in the order detection tries them.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from vitlab.checkpoints.io import CheckpointError, Imported, adapt_state, load_state_checked
from vitlab.checkpoints.pretrained import is_pretrained_name, resolve
from vitlab.config import ConfigError
from vitlab.models.vit import VisionTransformer

# name -> module; detection tries them in this order.
FORMATS: dict[str, str] = {
    "vitlab": "vitlab.checkpoints.io",  # .safetensors with vitlab metadata
    "hf": "vitlab.checkpoints.hf",  # a save_pretrained folder (config.json)
    "npz": "vitlab.checkpoints.npz",  # the official JAX archives
    "torchvision": "vitlab.checkpoints.torchvision",  # state dicts, told apart by their keys
    "timm": "vitlab.checkpoints.timm",
}


def format_module(name: str) -> ModuleType:
    if name not in FORMATS:
        raise CheckpointError(f"unknown checkpoint format {name!r}; known formats: {', '.join(FORMATS)}")
    return importlib.import_module(FORMATS[name])


def detect_format(path: str | os.PathLike) -> str:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or folder")
    for name in FORMATS:
        if format_module(name).detect(p):
            return name
    raise CheckpointError(
        f"{p}: not a checkpoint vitlab recognises; known formats: {', '.join(FORMATS)}. "
        "pass the format explicitly (--format on the command line, format=... in Python) if the file has an unusual name"
    )


def read_checkpoint(path: str | os.PathLike, format: Optional[str] = None) -> Imported:
    """Any checkpoint file or folder, or a published name, read into vitlab's names."""
    path = resolve(path)
    name = format or detect_format(path)
    imported = format_module(name).read(path)
    imported.source_format = name
    return imported


def build_model(imported: Imported, source: str, **overrides: Any) -> VisionTransformer:
    """A model of the imported config (with overrides), holding the imported weights."""
    if overrides.get("num_classes", imported.config.num_classes) != imported.config.num_classes:
        # A new head means transfer: the paper's fine-tuning head starts at zero (§3.1).
        overrides.setdefault("head_init", "zeros")
    try:
        config = imported.config.replace(**overrides)
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"{source}: {e}") from None
    state = adapt_state(imported.state, imported.config, config)
    model = VisionTransformer(config)
    load_state_checked(model, state, source)
    if config.num_classes == imported.config.num_classes:
        model.class_names = imported.class_names
    return model.eval()


def load(path: str | os.PathLike, format: Optional[str] = None, **overrides: Any) -> VisionTransformer:
    """A model from any checkpoint file or folder, or a published name; see vitlab.load."""
    return build_model(read_checkpoint(path, format), str(path), **overrides)


def save(model: VisionTransformer, path: str | os.PathLike, format: str = "vitlab", **kwargs: Any) -> None:
    format_module(format).write(model, path, **kwargs)


__all__ = [
    "FORMATS", "CheckpointError", "Imported", "build_model", "detect_format", "is_pretrained_name", "load",
    "read_checkpoint", "resolve", "save",
]
