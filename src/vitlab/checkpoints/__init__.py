"""Reading and writing checkpoints in every format vitlab knows.

Each format is a module with `detect(path) -> bool`, `read(path) -> Imported` and
`write(model, path)`. FORMATS lists them in the order detection tries them.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import torch

from vitlab import suggest
from vitlab.checkpoints import hf, hub, io, labels, npz, peers, pretrained, tables, timm, torchvision, verify
from vitlab.checkpoints.io import CheckpointError, Imported, adapt_state, load_state_checked
from vitlab.config import ConfigError
from vitlab.files import on_disk
from vitlab.models import Model, build

# name -> module; detection tries them in this order.
FORMATS: dict[str, ModuleType] = {
    "vitlab": io,  # .safetensors with vitlab metadata
    "hf": hf,  # a save_pretrained folder (config.json)
    "npz": npz,  # the official JAX archives
    "torchvision": torchvision,  # state dicts, told apart by their keys
    "timm": timm,
}

# The model kinds each format can hold: Hugging Face's ViT folders and torchvision's
# VisionTransformer state dicts have no form of a ResNet classifier.
HOLDS: dict[str, tuple[str, ...]] = {"vitlab": ("vit", "bit"), "npz": ("vit", "bit"), "timm": ("vit", "bit"),
                                     "hf": ("vit",), "torchvision": ("vit",)}
KIND_WORDS = {"vit": "ViT", "bit": "BiT ResNet"}


def format_module(name: str) -> ModuleType:
    if name not in FORMATS:
        raise CheckpointError(suggest.unknown("checkpoint format", name, FORMATS))
    return FORMATS[name]


# What reading a malformed file raises inside a reader (a missing key, an array of the wrong
# rank, a value of the wrong type, a third-party parser's own error): every one becomes a
# CheckpointError naming the file. Only running out of memory is left as it is.
MALFORMED = (Exception,)


def check_path(path: str | os.PathLike) -> Path:
    """A checkpoint is a regular file or a folder; anything else (a FIFO, a device) is refused
    before a reader opens it and blocks."""
    p = Path(path)
    if not on_disk(p):  # (text too long to be a path is no file either, not an OSError)
        names = [e.name for e in pretrained.PRETRAINED.values() if Path(e.path).name == p.name]
        where = (f"; {p.name} is the paper's published file: the name {' or '.join(names[:2])} downloads it "
                 "(vitlab.load(NAME), or put the file here)") if names else ""
        try:  # a model name with a slip in it (vit_tiny_patch16_22) is read as a path: say what is wrong with the name
            peers.read_peer_name(str(path))
        except ValueError as e:
            where += f"; as a model name: {e}"
        raise FileNotFoundError(f"{p}: no such file or folder{where}")
    if not p.is_dir():
        io.regular_file(p)
    return p


def detect_format(path: str | os.PathLike) -> tuple[str, Any]:
    """(the format's name, what its detector read: for vitlab's own, the header, which the
    reader then takes rather than reading it again)."""
    p = check_path(path)
    for name in FORMATS:
        try:
            found = format_module(name).detect(p)
        except MemoryError:
            raise
        except MALFORMED:  # a detector that chokes on a file: not that format
            found = False
        if found:
            return name, found
    what = tables.what_it_is(tables.peek_keys(p)) if p.is_file() else None
    if what:
        raise CheckpointError(f"{p}: {what}; vitlab reads ViTs and BiT ResNets (its ResNet baseline is BiT-R50x1)")
    raise CheckpointError(f"{p}: not a checkpoint vitlab recognises ({', '.join(FORMATS)}); pass --format (format=...) if its name is unusual")


def read_checkpoint(path_or_name: str | os.PathLike, format: Optional[str] = None, revision: Optional[str] = None) -> Imported:
    """A checkpoint file or folder in any format, or a name (`hf-hub:ORG/NAME`,
    `timm:NAME`, `MODEL:WEIGHTS`; see hub.py), fetched through the Hub cache first.

    ImageNet class names are attached to a 1000- or 21,843-class checkpoint that stores
    none, when it comes by name, is an official .npz, or is a state dict whose file name says
    ImageNet (labels.says_imagenet); `Imported.guessed` names every field the file lacked."""
    by_name = is_pretrained_name(path_or_name)
    changes: dict = {}
    path: str | os.PathLike
    if by_name:
        located = hub.locate(str(path_or_name), revision)
        path, format, changes = located.path, format or located.format, located.config_changes
    elif revision is not None:
        raise CheckpointError(f"{path_or_name}: revision={revision!r} applies to Hub names (hf-hub:ORG/NAME), not to files")
    else:
        path = path_or_name
    check_path(path)
    name, header = (format, None) if format else detect_format(path)
    try:
        imported = io.read(path, meta=header) if name == "vitlab" else format_module(name).read(path)
    except CheckpointError:
        raise
    except ConfigError as e:  # the file describes a model no config can hold
        raise CheckpointError(f"{path}: not a valid {name} checkpoint: {e}") from None
    except (MemoryError, OSError):  # not the file's content: no memory, no permission
        raise
    except MALFORMED as e:
        raise CheckpointError(f"{path}: a malformed {name} checkpoint ({type(e).__name__}: {e})") from None
    imported.source_format = name
    if changes:
        imported.config = imported.config.replace(**changes)
        imported.guessed = {k: v for k, v in imported.guessed.items() if k not in changes}  # the name's table says
    if imported.class_names is None and (by_name or labels.says_imagenet(name, path)):
        imported.class_names = labels.imagenet_names(imported.config.num_classes)
        if imported.class_names and not by_name:
            imported.guessed["class_names"] = (f"not in the file: ImageNet's, from the head's "
                                               f"{imported.config.num_classes} classes and the file's name")
    return imported


def build_model(imported: Imported, source: str, cpu_attention: str = "fused", **overrides: Any) -> Model:
    """A model of the imported config (with overrides), holding the imported weights."""
    if overrides.get("num_classes", imported.config.num_classes) != imported.config.num_classes:
        # A new head means transfer: the paper's fine-tuning head starts at zero (§3.1).
        overrides.setdefault("head_init", "zeros")
    try:
        config = imported.config.replace(**overrides)
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"{source}: {e}") from None
    state = adapt_state(imported.state, imported.config, config)
    model = build(config, cpu_attention)
    load_state_checked(model, state, source)
    if config.num_classes == imported.config.num_classes:
        model.class_names = imported.class_names
    return model.eval()


def load(path: str | os.PathLike, format: Optional[str] = None, revision: Optional[str] = None,
         **overrides: Any) -> Model:
    """A model from a checkpoint path or name (see read_checkpoint), with config overrides; see vitlab.load."""
    return build_model(read_checkpoint(path, format, revision), str(path), **overrides)


def open_checkpoint(path: str | os.PathLike, format: Optional[str] = None, random_init: Optional[int] = None,
                    device: Any = None, **overrides: Any) -> tuple[Model, Imported]:
    """(model in eval mode, Imported) for a checkpoint path or name; `overrides` change the
    config as load's do (image_size=384 resizes the position embeddings). `random_init=SEED`
    keeps the checkpoint's shape and class names but not its weights: a randomly initialised
    baseline, the same for the same seed."""
    imported = read_checkpoint(path, format)
    if random_init is not None:
        model = random_model(imported, random_init, **overrides)
    else:
        model = build_model(imported, str(path), **overrides)
    return (model.to(device) if device is not None else model).eval(), imported


def random_model(imported: Imported, seed: int, **overrides: Any) -> Model:
    """A randomly initialised model of `imported`'s shape and class names, the same for the same
    seed: the baseline of `random_init=SEED`, and one draw of a random-init null."""
    torch.manual_seed(seed)
    model = build(imported.config.replace(**overrides) if overrides else imported.config)
    model.class_names = imported.class_names
    return model


def resolve(path_or_name: str | os.PathLike, revision: Optional[str] = None) -> Path:
    """The local file or folder of a checkpoint path or name (fetched into the cache first).
    Reading goes through read_checkpoint, which also applies what a name adds (the registry's
    preprocessing, ImageNet's class names); this is for callers that need the path itself."""
    return hub.locate(str(path_or_name), revision).path if is_pretrained_name(path_or_name) else Path(path_or_name)


def save(model: Model, path: str | os.PathLike, format: str = "vitlab", **kwargs: Any) -> None:
    """Write `model` in `format`; warns when the name lacks the suffix the format's readers
    look for, and when the file cannot carry a preprocessing setting."""
    io.refuse_serving_copy(model)  # deploy's int8/bf16/packed copies: refused by name, before any write
    module = format_module(format)
    kind = model.config.kind
    if kind not in HOLDS[format]:
        able = ", ".join(f for f, kinds in HOLDS.items() if kind in kinds)
        kinds = " or ".join(KIND_WORDS[k] for k in HOLDS[format])
        raise CheckpointError(f"the {format} format holds {kinds} models only, not {model.config.name} "
                              f"({KIND_WORDS[kind]}); write it as {able}")
    note = verify.suffix_warning(path, format)
    if note:
        warnings.warn(note, stacklevel=2)
    module.write(model, path, **kwargs)


def save_verified(model: Model, path: str | os.PathLike, format: str = "vitlab", verify_logits: bool = True,
                  **kwargs: Any) -> verify.Verified:
    """`save`, proven: written beside `path`, loaded back as a model, its logits compared with
    the original's on a probe batch, and only then moved into place (see checkpoints.verify)."""
    owned = getattr(format_module(format), "written_by_us", None)
    return verify.write_verified(model, path, format, load, save, owned=owned, verify=verify_logits, **kwargs)


is_pretrained_name = hub.is_pretrained_name  # the one test of "a name, not a path"

__all__ = ["FORMATS", "HOLDS", "CheckpointError", "Imported", "build_model", "detect_format", "is_pretrained_name", "load",
           "open_checkpoint", "read_checkpoint", "resolve", "save", "save_verified"]
