"""vitlab's own checkpoint format, and what every format shares.

A vitlab checkpoint is one `.safetensors` file: the model's state dict, with the full config,
its kind ("vit" or "bit"; files written before BiT existed have none and are ViTs), the class
names and the format version in the file's metadata, so the file alone rebuilds its model.
Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from vitlab.config import BiTConfig, ConfigError, ModelConfig, ViTConfig, config_from_dict, config_kind
from vitlab.config.fields import Reasoned
from vitlab.files import NotRegularFileError, atomic_write, require_regular_file
from vitlab.models import Model, build
from vitlab.models.pos_embed import resize_position_state

FORMAT_NAME = "vitlab"
# Tensors that belong to a training objective, not to the classifier (e.g. the masked patch
# prediction head, §4.6) are stored under this prefix and handed back apart from the model.
EXTRA_PREFIX = "objective."
FORMAT_VERSION = "1"
# Metadata key of a serving copy's file (vitlab.deploy.save_int8): not a plain model.
SERVING_KEY = "serving"


class CheckpointError(Reasoned, ValueError):
    """A file that cannot be read as the checkpoint it claims to be; names file, keys, shapes."""


@dataclass
class Imported:
    """What a format reader returns: a config, a state dict in vitlab's names, class names."""

    config: ModelConfig
    state: dict[str, Tensor]
    class_names: Optional[list[str]] = None
    source_format: str = FORMAT_NAME
    extras: dict[str, Tensor] = field(default_factory=dict)  # objective tensors, prefix removed
    metadata: dict[str, str] = field(default_factory=dict)
    # Fields the file does not hold, with where their value came from instead ("timm's
    # pretrained_cfg default for vit_tiny_patch16_224"): `vitlab info` marks them.
    guessed: dict[str, str] = field(default_factory=dict)


# A model's preprocessing fields: what a state dict never stores.
PREPROCESSING_FIELDS = ("mean", "std", "crop_fraction", "crop_mode", "interpolation", "resize_backend")


def guessed_preprocessing(source: str) -> dict[str, str]:
    """Every preprocessing field marked as taken from `source` (the file names none)."""
    return {k: f"not in the file: {source}" for k in PREPROCESSING_FIELDS}


# Writing ---------------------------------------------------------------------------------
def write(model: Model, path: str | os.PathLike, extra_metadata: Optional[dict] = None,
          extra_tensors: Optional[dict[str, Tensor]] = None) -> None:
    """Write the model; `extra_tensors` (an objective's own weights) and `extra_metadata`
    travel in the same file and come back in `Imported.extras` / `Imported.metadata`."""
    write_state(model.config, model.state_dict(), model.class_names, path, extra_metadata, extra_tensors)


def write_state(config: ModelConfig, state: dict[str, Tensor], class_names: Optional[list[str]], path: str | os.PathLike,
                extra_metadata: Optional[dict] = None, extra_tensors: Optional[dict[str, Tensor]] = None) -> None:
    """`write` for weights held apart from a model (gathered shards, averaged weights)."""
    from safetensors.torch import save_file

    metadata = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "config": config.to_json(),
                "config_kind": config_kind(config), "class_names": json.dumps(head_names(config, class_names))}
    for k, v in (extra_metadata or {}).items():
        metadata[k] = v if isinstance(v, str) else json.dumps(v)
    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    for k, v in (extra_tensors or {}).items():
        state[EXTRA_PREFIX + k] = v.detach().cpu().contiguous()
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata=metadata))


def head_names(config: ModelConfig, class_names: Optional[list[str]]) -> Optional[list[str]]:
    """The class names to store: one per class of the head, else none (names left over from
    another head, after `reset_classifier`, describe nothing in this file)."""
    if class_names is None or len(class_names) != config.num_classes:
        return None
    return [str(n) for n in class_names]
def refuse_serving_copy(model: torch.nn.Module) -> None:
    """vitlab.deploy's serving copies (int8, bf16, packed) hold tensors a ViT does not: a file
    of them would not load. Refuse before writing, and say what to do instead."""
    kind = getattr(model, "serving", "")
    if kind.startswith("int8"):
        raise CheckpointError(f"this is an {kind} serving copy of a model: save it with vitlab.deploy.save_int8, or save the fp32 model")
    if kind:
        raise CheckpointError(f"this is a serving copy ({kind}): save the fp32 model it was made from, and make the copy again")


# Reading ---------------------------------------------------------------------------------
def regular_file(path: str | os.PathLike) -> Path:
    """`path`, checked to be a non-empty regular file before anything opens it (a FIFO would
    block the reader forever, a device would never end)."""
    try:
        path = require_regular_file(path, "checkpoint file")
    except NotRegularFileError as e:
        raise CheckpointError(str(e)) from None
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the file is empty (0 bytes); an interrupted download or copy?")
    return path


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    from safetensors import safe_open

    regular_file(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types for foreign files
        raise CheckpointError(f"{path}: not a readable .safetensors file ({e})") from None


def detect(path: Path) -> Optional[dict[str, str]]:
    """The file's header (its metadata) when it is a vitlab checkpoint, for `read` to take
    instead of reading it again; None when it is not one."""
    if path.is_file() and path.suffix == ".safetensors":
        try:
            meta = read_metadata(path)
        except CheckpointError:
            return None
        return meta if meta.get("format") == FORMAT_NAME else None
    return None


def read(path: str | os.PathLike, serving: str = "", meta: Optional[dict[str, str]] = None) -> Imported:
    """A vitlab checkpoint; `serving="int8"` reads a serving copy's file (vitlab.deploy.load_int8);
    `meta`: its header, when detection has read it."""
    from safetensors.torch import load_file

    meta = read_metadata(path) if meta is None else meta
    if meta.get(SERVING_KEY, "") != serving:
        kind = meta.get(SERVING_KEY)
        raise CheckpointError(f"{path}: a serving copy ({kind}): read it with vitlab.deploy.load_int8(path)" if kind
                              else f"{path}: a plain vitlab checkpoint, not a serving copy ({serving}): read it with vitlab.load",
                              reason="serving-copy")
    if meta.get("format") != FORMAT_NAME or "config" not in meta:
        raise CheckpointError(f"{path}: a .safetensors file without vitlab metadata (format={meta.get('format')!r}); "
                              "if it holds timm or Hugging Face weights, load it with format='timm' or 'hf'")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: vitlab format version {meta.get('format_version')!r}, this vitlab reads {FORMAT_VERSION!r}")
    try:
        config = config_from_dict(json.loads(meta["config"]), meta.get("config_kind", "vit"))
    except (ConfigError, json.JSONDecodeError, TypeError) as e:
        raise CheckpointError(f"{path}: the stored config is invalid: {e}") from None
    class_names = parse_class_names(meta.get("class_names"), config.num_classes, str(path), "class_names")
    try:
        state = load_file(str(path))
    except Exception as e:
        raise CheckpointError(f"{path}: the tensors cannot be read ({e}); the file may be truncated") from None
    extras = {k[len(EXTRA_PREFIX) :]: state.pop(k) for k in list(state) if k.startswith(EXTRA_PREFIX)}
    if not serving:  # a serving copy holds other tensors (int8 weights and scales): its reader checks them
        check_state(config, state, str(path))
    return Imported(config, state, class_names, extras=extras, metadata=meta)


def parse_class_names(raw: Optional[str], num_classes: int, source: str, key: str) -> Optional[list[str]]:
    """The class names a file's metadata stores (JSON), checked against its head: one string
    per class, or none at all."""
    try:
        names = json.loads(raw) if raw else None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{source}: the {key} metadata is not JSON ({e}); the file is damaged") from None
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{source}: the {key} metadata must be a list of strings, found {str(names)[:80]}")
    if len(names) != num_classes:
        raise CheckpointError(f"{source}: {len(names)} class names for a head of {num_classes} classes; the file is damaged")
    return names


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of a model of `cfg`, built on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        model = build(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_state(config: ModelConfig, state: dict[str, Tensor], source: str) -> None:
    """The stored config and the stored tensors describe the same model: every key of that
    model, each of its shape, nothing else (a config that says width 128 over 64-wide tensors
    is refused here, not when something later multiplies them)."""
    problems = state_problems(expected_shapes(config), state)
    if problems:
        raise CheckpointError(f"{source}: the stored config does not fit the tensors ({config.name}): " + " | ".join(problems),
                              reason="config-mismatch")


def state_problems(expected: dict[str, tuple[int, ...]], state: dict[str, Tensor], optional: tuple[str, ...] = ()) -> list[str]:
    """What keeps `state` from loading into a model with these shapes: missing keys (other than
    the `optional` prefixes), unexpected keys, wrong shapes, each named."""
    missing = [k for k in expected if k not in state and not k.startswith(optional)]
    unexpected = [k for k in state if k not in expected]
    wrong = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k])}"
             for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k])]
    named = (("missing keys ", missing), ("unexpected keys ", unexpected), ("wrong shapes: ", wrong))
    return [head + "; ".join(keys[:8]) + (" ..." if len(keys) > 8 else "") for head, keys in named if keys]


# Shared by every reader ------------------------------------------------------------------
def adapt_state(state: dict[str, Tensor], old: ModelConfig, new: ModelConfig) -> dict[str, Tensor]:
    """Make a state dict for `old` fit a model of `new` where the paper says how (§3.2):
    position embeddings are resized; a head of another class count is dropped (a fresh,
    zero-initialised one is built); pre-logits are dropped when the new model has none.
    A BiT ResNet reads any image size; only its head can change."""
    if isinstance(new, BiTConfig):
        return state if new.num_classes == old.num_classes else {k: v for k, v in state.items() if not k.startswith("head.")}
    assert isinstance(old, ViTConfig), "a checkpoint's config keeps its kind (new is a ViT here)"
    state = resize_position_state(state, "", old, new)
    if new.num_classes != old.num_classes:
        state = {k: v for k, v in state.items() if not k.startswith("head.")}
    if new.representation_size != old.representation_size:
        state = {k: v for k, v in state.items() if not k.startswith("pre_logits.")}
        if new.num_classes == old.num_classes:  # the old head reads the old representation
            state = {k: v for k, v in state.items() if not k.startswith("head.")}
    return state


def load_state_checked(model: Model, state: dict[str, Tensor], source: str) -> None:
    """load_state_dict that names the file, the keys and the shapes of every mismatch.

    Keys the reader left out on purpose (a dropped head or pre-logits) keep the model's fresh
    initialisation; anything else missing is an error.
    """
    expected = model.state_dict()
    problems = state_problems({k: tuple(v.shape) for k, v in expected.items()}, state, ("head.", "pre_logits."))
    if problems:
        raise CheckpointError(f"{source}: does not fit {model.config.name}: " + " | ".join(problems))
    check_values(state, source)
    with torch.no_grad():
        model.load_state_dict({**expected, **state}, strict=True)


def check_values(state: dict[str, Tensor], source: str) -> None:
    """Weights a model can compute with: floating point and finite. NaN or infinite weights
    (a diverged run saved by another tool, a damaged file) would give NaN for every image."""
    for k, t in state.items():
        if not t.is_floating_point():
            raise CheckpointError(f"{source}: tensor {k} has dtype {t.dtype}; model weights are floating point")
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise CheckpointError(f"{source}: tensor {k} holds {bad} NaN or infinite value(s) (a diverged run, or a damaged file)")
