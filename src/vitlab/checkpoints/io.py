"""vitlab's own checkpoint format, and what every format shares.

A vitlab checkpoint is one `.safetensors` file: the model's state dict, with the full config,
the class names and the format version in the file's metadata, so the file alone rebuilds
its model. Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from vitlab.config import ConfigError, ViTConfig
from vitlab.files import atomic_write
from vitlab.models.pos_embed import resize_position_state
from vitlab.models.vit import VisionTransformer

FORMAT_NAME = "vitlab"
# Tensors that belong to a training objective, not to the classifier (e.g. the masked patch
# prediction head, §4.6) are stored under this prefix and handed back apart from the model.
EXTRA_PREFIX = "objective."
FORMAT_VERSION = "1"


class CheckpointError(ValueError):
    """A file that cannot be read as the checkpoint it claims to be; names file, keys, shapes."""


@dataclass
class Imported:
    """What a format reader returns: a config, a state dict in vitlab's names, class names."""

    config: ViTConfig
    state: dict[str, Tensor]
    class_names: Optional[list[str]] = None
    source_format: str = FORMAT_NAME
    extras: dict[str, Tensor] = field(default_factory=dict)  # objective tensors, prefix removed
    metadata: dict[str, str] = field(default_factory=dict)


# Writing ---------------------------------------------------------------------------------
def contiguous_state(model: torch.nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}


def write(
    model: VisionTransformer,
    path: str | os.PathLike,
    extra_metadata: Optional[dict] = None,
    extra_tensors: Optional[dict[str, Tensor]] = None,
) -> None:
    """Write the model; `extra_tensors` (an objective's own weights) and `extra_metadata`
    travel in the same file and come back in `Imported.extras` / `Imported.metadata`."""
    write_state(model.config, contiguous_state(model), model.class_names, path, extra_metadata, extra_tensors)


def write_state(
    config: ViTConfig,
    state: dict[str, Tensor],
    class_names: Optional[list[str]],
    path: str | os.PathLike,
    extra_metadata: Optional[dict] = None,
    extra_tensors: Optional[dict[str, Tensor]] = None,
) -> None:
    """`write` for weights held apart from a model (gathered shards, averaged weights)."""
    from safetensors.torch import save_file

    metadata = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "config": config.to_json(),
        "class_names": json.dumps(class_names),
    }
    for k, v in (extra_metadata or {}).items():
        metadata[k] = v if isinstance(v, str) else json.dumps(v)
    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    for k, v in (extra_tensors or {}).items():
        state[EXTRA_PREFIX + k] = v.detach().cpu().contiguous()
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata=metadata))


# Reading ---------------------------------------------------------------------------------
def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types for foreign files
        raise CheckpointError(f"{path}: not a readable .safetensors file ({e})") from None


def detect(path: Path) -> bool:
    if path.is_file() and path.suffix == ".safetensors":
        try:
            return read_metadata(path).get("format") == FORMAT_NAME
        except CheckpointError:
            return False
    return False


def read(path: str | os.PathLike) -> Imported:
    from safetensors.torch import load_file

    meta = read_metadata(path)
    if meta.get("format") != FORMAT_NAME or "config" not in meta:
        raise CheckpointError(
            f"{path}: a .safetensors file without vitlab metadata (format={meta.get('format')!r}); "
            "if it holds timm or Hugging Face weights, load it with format='timm' or 'hf'"
        )
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: vitlab format version {meta.get('format_version')!r}, this vitlab reads {FORMAT_VERSION!r}"
        )
    try:
        config = ViTConfig.from_dict(json.loads(meta["config"]))
    except (ConfigError, json.JSONDecodeError, TypeError) as e:
        raise CheckpointError(f"{path}: the stored config is invalid: {e}") from None
    class_names = json.loads(meta.get("class_names") or "null")
    try:
        state = load_file(str(path))
    except Exception as e:
        raise CheckpointError(f"{path}: the tensors cannot be read ({e}); the file may be truncated") from None
    extras = {k[len(EXTRA_PREFIX) :]: state.pop(k) for k in list(state) if k.startswith(EXTRA_PREFIX)}
    return Imported(config, state, class_names, extras=extras, metadata=meta)


# Shared by every reader ------------------------------------------------------------------
def adapt_state(state: dict[str, Tensor], old: ViTConfig, new: ViTConfig) -> dict[str, Tensor]:
    """Make a state dict for `old` fit a model of `new` where the paper says how (§3.2):
    position embeddings are resized; a head of another class count is dropped (a fresh,
    zero-initialised one is built); pre-logits are dropped when the new model has none."""
    state = resize_position_state(state, "", old, new)
    if new.num_classes != old.num_classes:
        state = {k: v for k, v in state.items() if not k.startswith("head.")}
    if new.representation_size != old.representation_size:
        state = {k: v for k, v in state.items() if not k.startswith("pre_logits.")}
        if new.num_classes == old.num_classes:  # the old head reads the old representation
            state = {k: v for k, v in state.items() if not k.startswith("head.")}
    return state


def load_state_checked(model: VisionTransformer, state: dict[str, Tensor], source: str) -> None:
    """load_state_dict that names the file, the keys and the shapes of every mismatch.

    Keys the reader left out on purpose (a dropped head or pre-logits) keep the model's fresh
    initialisation; anything else missing is an error.
    """
    expected = model.state_dict()
    optional = ("head.", "pre_logits.")
    missing = [k for k in expected if k not in state and not k.startswith(optional)]
    unexpected = [k for k in state if k not in expected]
    wrong = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected
        if k in state and tuple(state[k].shape) != tuple(expected[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing keys {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
    if wrong:
        problems.append("wrong shapes: " + "; ".join(wrong[:8]))
    if problems:
        raise CheckpointError(f"{source}: does not fit {model.config.name}: " + " | ".join(problems))
    with torch.no_grad():
        model.load_state_dict({**expected, **state}, strict=True)
