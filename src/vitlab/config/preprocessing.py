"""The evaluation preprocessing a model expects, as numbers a runtime without vitlab can
implement: `eval_recipe` (the resize's kind, box, interpolation and backend, the centre crop,
channels, mean and std; what an ONNX file's metadata carries, one key each) and
`recipe_sentence`, the same in words exact enough to implement it. data/transforms.py's
EvalTransform runs this recipe; deploy/export.py writes it."""

from __future__ import annotations

import math
from typing import Any, Sequence


def eval_recipe(image_size: int | Sequence[int], mean: Sequence[float] = (0.5, 0.5, 0.5),
                std: Sequence[float] = (0.5, 0.5, 0.5), in_channels: int = 3, crop_fraction: float = 1.0,
                crop_mode: str = "squash", interpolation: str = "bilinear", backend: str = "pil",
                antialias: bool = True) -> dict[str, Any]:
    """The resize aims for floor(side / crop_fraction) (timm's sizes): both sides ("squash"),
    the shorter side ("shorter_side", a square box) or the aspect kept to cover the box
    ("cover"); then the centre `image_size` crop where the box is larger or the mode crops.
    `antialias` False (data.antialias) resizes without a filter, on the "tensor" backend."""
    h, w = (image_size, image_size) if isinstance(image_size, int) else (int(image_size[0]), int(image_size[1]))
    rh, rw = math.floor(h / crop_fraction), math.floor(w / crop_fraction)
    crops = (rh, rw) != (h, w) or crop_mode == "center"
    return {"image_size": [h, w], "in_channels": in_channels,
            "resize": "squash" if crop_mode == "squash" else "shorter_side" if rh == rw else "cover",
            "resize_size": [rh, rw], "interpolation": interpolation, "resize_backend": backend, "antialias": antialias,
            "crop_fraction": crop_fraction, "crop_mode": crop_mode, "crop": [h, w] if crops else None,
            "mean": [float(x) for x in mean], "std": [float(x) for x in std]}


def config_recipe(config) -> dict[str, Any]:
    """`eval_recipe` of a model's config (a ViTConfig or anything with its preprocessing fields)."""
    return eval_recipe(config.image_size, config.mean, config.std, config.in_channels, config.crop_fraction,
                       config.crop_mode, config.interpolation, getattr(config, "resize_backend", "pil"))


def recipe_sentence(r: dict[str, Any]) -> str:
    """`eval_recipe`'s dict in words: every size and rounding rule."""
    (h, w), (rh, rw) = r["image_size"], r["resize_size"]
    by = ("PIL's Image.resize on the 8-bit image" if r["resize_backend"] == "pil" else
          f"torchvision.transforms.v2.functional.resize on the uint8 (C, H, W) tensor, antialias={r['antialias']}")
    resize = {"squash": f"resize it to {rh}x{rw} (height x width; the aspect ratio is not kept)",
              "shorter_side": f"resize its shorter side to {rh} px and the longer one to floor({rh} x longer / shorter) px",
              "cover": f"resize it by r = min(H / {rh}, W / {rw}) to round(H / r) x round(W / r) px"}[r["resize"]]
    crop = (f"; then crop its centre {h}x{w} (top = round((resized height - {h}) / 2), left = round((resized "
            f"width - {w}) / 2), halves rounded to even)" if r["crop"] else "")
    numbers = lambda v: "(" + ", ".join(f"{x:g}" for x in v) + ")"  # noqa: E731
    c = r["in_channels"]
    return (f"Take the image as {'RGB' if c == 3 else 'greyscale (L)'} (H x W pixels); {resize} "
            f"({r['interpolation']}, by {by}){crop}; scale the pixels to [0, 1] (x / 255), then (x - mean) / std per "
            f"channel, mean {numbers(r['mean'])}, std {numbers(r['std'])}; input NCHW float32 (batch, {c}, {h}, {w})")
