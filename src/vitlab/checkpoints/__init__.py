"""Reading and writing checkpoints in every format vitlab knows.

Each format is a module with `detect(path) -> bool`, `read(path) -> Imported` and
`write(model, path)`. FORMATS lists them in the order detection tries them.
"""

from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from vitlab.checkpoints import io, verify
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


# What reading a malformed file raises inside a reader (a missing key, an array of the wrong
# rank, a value of the wrong type, a third-party parser's own error): every one becomes a
# CheckpointError naming the file. Only running out of memory is left as it is.
MALFORMED = (Exception,)


def check_path(path: str | os.PathLike) -> Path:
    """A checkpoint is a regular file or a folder; anything else (a FIFO, a device) is refused
    before a reader opens it and blocks."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or folder")
    if not p.is_dir():
        io.regular_file(p)
    return p


def detect_format(path: str | os.PathLike) -> str:
    p = check_path(path)
    for name in FORMATS:
        try:
            found = format_module(name).detect(p)
        except MemoryError:
            raise
        except MALFORMED:  # a detector that chokes on a file: not that format
            found = False
        if found:
            return name
    raise CheckpointError(
        f"{p}: not a checkpoint vitlab recognises; known formats: {', '.join(FORMATS)}. "
        "pass the format explicitly (--format on the command line, format=... in Python) if the file has an unusual name"
    )


def read_checkpoint(path: str | os.PathLike, format: Optional[str] = None) -> Imported:
    """Any checkpoint file or folder, or a published name, read into vitlab's names."""
    path = resolve(path)
    check_path(path)
    name = format or detect_format(path)
    try:
        imported = format_module(name).read(path)
    except CheckpointError:
        raise
    except ConfigError as e:  # the file describes a model no config can hold
        raise CheckpointError(f"{path}: not a valid {name} checkpoint: {e}") from None
    except (MemoryError, OSError):  # not the file's content: no memory, no permission
        raise
    except MALFORMED as e:
        raise CheckpointError(f"{path}: a malformed {name} checkpoint ({type(e).__name__}: {e})") from None
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
    """Write `model` in `format`; warns when the name lacks the suffix the format's readers
    look for, and when the file cannot carry a preprocessing setting."""
    module = format_module(format)
    note = verify.suffix_warning(path, format)
    if note:
        warnings.warn(note)
    module.write(model, path, **kwargs)


def save_verified(model: VisionTransformer, path: str | os.PathLike, format: str = "vitlab", verify_logits: bool = True,
                  **kwargs: Any) -> verify.Verified:
    """`save`, proven: written beside `path`, loaded back as a model, its logits compared with
    the original's on a probe batch, and only then moved into place (see checkpoints.verify)."""
    owned = getattr(format_module(format), "written_by_us", None)
    return verify.write_verified(model, path, format, load, save, owned=owned, verify=verify_logits, **kwargs)


__all__ = [
    "FORMATS", "CheckpointError", "Imported", "build_model", "detect_format", "is_pretrained_name", "load",
    "read_checkpoint", "resolve", "save", "save_verified",
]
