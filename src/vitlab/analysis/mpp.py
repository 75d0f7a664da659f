"""What a masked-patch-prediction checkpoint predicts (§4.6): numbers for `vitlab inspect`.

Corrupts a few images exactly as pretraining does (masks from a fixed seed), runs the
encoder and the stored prediction head, and returns, per patch, what happened to it and the
true and predicted colours, as arrays ready to draw (`mpp_plot.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vitlab.checkpoints import CheckpointError
from vitlab.config import MPPConfig
from vitlab.data.masking import KIND_NAMES, UNTOUCHED, draw
from vitlab.models.mpp import MPPHead, dequantise_colors, unnormalise


@dataclass
class MPPPredictions:
    """Colours are (B, h, w, C) in [0, 1] on the target's own grid: one cell per patch for
    mean_color, g x g cells per patch for color_grid, every pixel for pixels."""

    target: str
    images: np.ndarray  # (B, H, W, C) the input pixels in [0, 1]
    kind: np.ndarray  # (B, gh, gw) codes of vitlab.data.masking: 0 untouched, 1 mask, 2 random, 3 unchanged
    true: np.ndarray  # target colours (quantised to bin centres for the colour targets)
    predicted: np.ndarray  # predicted colours (the argmax class's bin centre)
    accuracy: float  # share of corrupted patches (cells) whose colour class is right; nan for pixels
    accuracy_by_kind: dict[str, float]  # the same, split by what was done to the patch
    mean_level_error: float  # mean |predicted - true| in quantisation levels (pixels: in 1/255)


def _to_image(colors: Tensor, gh: int, gw: int, cells: int) -> Tensor:
    """(B, N, cells*cells, C) per patch -> (B, gh*cells, gw*cells, C)."""
    b, _, _, c = colors.shape
    x = colors.view(b, gh, gw, cells, cells, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, gh * cells, gw * cells, c)


@torch.no_grad()
def mpp_predictions(model, head: MPPHead, images: Tensor, seed: int = 0) -> MPPPredictions:
    """Run a backbone and its MPP head (`vitlab.models.mpp.MPPHead`) on normalised images."""
    model.eval()
    cfg, mc = head.cfg, model.config
    p, c = mc.patch_size, mc.in_channels
    b, gh, gw = images.shape[0], images.shape[2] // p, images.shape[3] // p
    kind, sources = draw(cfg, images, p, torch.Generator().manual_seed(seed))  # as pretraining draws them
    pred, target = head.predict(model, images, sources)
    pred, target = pred.cpu(), target.cpu()
    pixels = unnormalise(images.float(), mc.mean, mc.std).cpu()
    levels = 2**cfg.bits

    if cfg.target == "pixels":
        cells = p
        true_c = target.view(b, gh * gw, p * p, c)
        pred_c = pred.clamp(0, 1).view(b, gh * gw, p * p, c)
        right = torch.full(kind.shape, float("nan"))
        err = (pred_c - true_c).abs().mean(dim=(2, 3)) * 255
    else:
        cells = cfg.grid if cfg.target == "color_grid" else 1
        classes = pred.view(b, gh * gw, cells * cells, -1).argmax(-1)  # (B, N, cells^2)
        true_idx = target.view(b, gh * gw, cells * cells)
        true_c, pred_c = dequantise_colors(true_idx, c, cfg.bits), dequantise_colors(classes, c, cfg.bits)
        right = (classes == true_idx).float().mean(-1)  # (B, N)
        err = ((pred_c - true_c).abs() * levels).mean(dim=(2, 3))

    selected = kind != UNTOUCHED
    by_kind = {name: float(right[kind == code].mean()) for code, name in KIND_NAMES.items() if (kind == code).any()}
    return MPPPredictions(
        target=cfg.target,
        images=pixels.permute(0, 2, 3, 1).numpy(),
        kind=kind.view(b, gh, gw).numpy(),
        true=_to_image(true_c, gh, gw, cells).numpy(),
        predicted=_to_image(pred_c, gh, gw, cells).numpy(),
        accuracy=float(right[selected].mean()),
        accuracy_by_kind=by_kind,
        mean_level_error=float(err[selected].mean()),
    )


def head_from_extras(model, metadata: dict[str, str], extras: dict[str, Tensor]) -> MPPHead:
    """The MPP head a checkpoint stored beside its backbone (`Imported.metadata` / `.extras`)."""
    if "mask_token" not in extras:
        raise CheckpointError("not a masked-patch-prediction checkpoint (no [mask] embedding): train one with `vitlab train --objective mpp`")
    cfg = MPPConfig.from_dict(json.loads(metadata.get("objective_options") or "{}"))
    head = MPPHead(cfg, model.config)
    head.load_extra_tensors(extras)
    return head.to(next(model.parameters()).device).eval()


def summary_numbers(result: MPPPredictions) -> dict[str, Any]:
    """The figure's numbers for the inspect JSON (no NaN: pixel regression has no accuracy)."""
    regression = result.target == "pixels"
    return {
        "target": result.target,
        "images": int(result.images.shape[0]),
        "corrupted_patches": int((result.kind != 0).sum()),
        "color_accuracy": None if regression else result.accuracy,
        "color_accuracy_by_kind": None if regression else result.accuracy_by_kind,
        "mean_level_error": result.mean_level_error,
    }


__all__ = ["MPPPredictions", "head_from_extras", "mpp_predictions", "summary_numbers"]
