"""What a model's forward accepts, in one place: the tensors and arrays PyTorch users pass.

- A float tensor of any precision (float64, float32, float16, bfloat16): normalised pixels,
  as `vitlab.transform(model)` makes them; cast to the model's own dtype and moved to its
  device.
- A uint8 tensor: raw pixels 0-255, scaled to [0, 1] and normalised with the model's mean
  and std (its config) by vitlab.pixels, the normaliser `vitlab.transform` uses: the same numbers.
- A numpy array: read as the tensor of its dtype (float, or uint8 pixels).
- Anything else (int64, bool or complex tensors, lists, PIL images, None) is a TypeError that
  says what to pass; a batch of another layout or channel count is a ValueError that names it
  (the image size is the model's own check: a ViT's grid is fixed, a ResNet reads any size).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vitlab.config import ModelConfig
from vitlab.pixels import normalise

FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def as_image_batch(x: Any, like: Tensor, cfg: ModelConfig) -> Tensor:
    """`x` as a (B, C, H, W) tensor of `like`'s dtype and device, with the channels `cfg` takes
    (see the module docstring)."""
    name = cfg.name
    if not isinstance(x, Tensor):
        import numpy as np

        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} takes a (B, C, H, W) image tensor or numpy array, not {type(x).__name__}; "
                            "for PIL images use vitlab.transform(model)(image)[None]")
        if x.dtype.kind not in "fu" or (x.dtype.kind == "u" and x.dtype != np.uint8):
            raise TypeError(f"{name}: a numpy array of {x.dtype} cannot be images; pass float pixels normalised "
                            "with the model's mean and std (vitlab.transform), or uint8 pixels 0-255")
        x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32 if x.dtype.kind == "f" else np.uint8))
    if x.dtype != torch.uint8 and x.dtype not in FLOATS:
        raise TypeError(f"{name}: a tensor of {str(x.dtype).removeprefix('torch.')} cannot be images; pass float pixels "
                        "normalised with the model's mean and std (vitlab.transform), or uint8 pixels 0-255")
    if x.dim() != 4:
        raise ValueError(f"expected an NCHW image batch, got a tensor of shape {tuple(x.shape)}")
    if x.shape[1] != cfg.in_channels:
        raise ValueError(f"{name} expects {cfg.in_channels} input channels, got {x.shape[1]} (shape {tuple(x.shape)}); "
                         "convert the images (e.g. greyscale to RGB) first")
    if x.dtype == torch.uint8:
        return normalise(x.to(like.device), cfg.mean, cfg.std).to(like.dtype)  # vitlab.pixels: the one normaliser
    if x.dtype != like.dtype or x.device != like.device:
        x = x.to(device=like.device, dtype=like.dtype)
    return x
