"""Preprocessing as the paper does it (§4.1, Appendix B.1): inception-style random crop and
horizontal flip for training, a plain resize for evaluation, then pixels normalised with the
model's mean/std ((0.5, 0.5, 0.5) maps them to [-1, 1], as in the official code).

Both transforms take a PIL image of any mode (L, RGB, RGBA, P, I;16, ...) and return a
float tensor (C, H, W). The augmentations are torchvision's; RandAugment is an option.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from PIL import Image
from torch import Tensor


def to_mode(image: Image.Image, in_channels: int) -> Image.Image:
    """Bring any PIL mode to L (1 channel) or RGB (3 channels).

    16/32-bit greyscale is scaled, not clipped: PIL's own I;16 -> L conversion saturates
    everything above 255, which would turn most of a 16-bit image white.
    """
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        a = np.asarray(image).astype(np.float64)
        scale = 1.0 if image.mode == "F" else 65535.0
        a = np.clip(a / scale, 0.0, 1.0) * 255.0
        image = Image.fromarray(np.round(a).astype(np.uint8), mode="L")
    if in_channels == 1:
        return image if image.mode == "L" else image.convert("L")
    if in_channels == 3:
        if image.mode == "RGB":
            return image
        if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
            # Transparent pixels over white, the way a viewer shows them.
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(background, rgba).convert("RGB")
        return image.convert("RGB")
    raise ValueError(f"images are read as 1 (L) or 3 (RGB) channels, not {in_channels}")


def _size(image_size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(image_size, int):
        return image_size, image_size
    h, w = image_size
    return int(h), int(w)


def _finish(mean: Sequence[float], std: Sequence[float]) -> list[Callable]:
    from torchvision import transforms as T

    return [T.PILToTensor(), T.ConvertImageDtype(__import__("torch").float32), T.Normalize(list(mean), list(std))]


def eval_transform(
    image_size: int | Sequence[int],
    mean: Sequence[float] = (0.5, 0.5, 0.5),
    std: Sequence[float] = (0.5, 0.5, 0.5),
    in_channels: int = 3,
) -> Callable[[Image.Image], Tensor]:
    """Resize to the model's resolution (the paper evaluates at the full image, no crop)."""
    from torchvision import transforms as T

    return T.Compose(
        [
            T.Lambda(lambda im: to_mode(im, in_channels)),
            T.Resize(_size(image_size), interpolation=T.InterpolationMode.BILINEAR, antialias=True),
            *_finish(mean, std),
        ]
    )


def train_transform(
    image_size: int | Sequence[int],
    mean: Sequence[float] = (0.5, 0.5, 0.5),
    std: Sequence[float] = (0.5, 0.5, 0.5),
    in_channels: int = 3,
    crop_scale: Sequence[float] = (0.08, 1.0),
    crop_ratio: Sequence[float] = (3 / 4, 4 / 3),
    hflip: bool = True,
    randaugment: int = 0,
    randaugment_magnitude: int = 9,
) -> Callable[[Image.Image], Tensor]:
    """Inception-style crop (random area and aspect ratio, resized to the model's size) and
    a horizontal flip (Appendix B.1); RandAugment(num_ops=randaugment) when > 0.

    The random numbers come from torch's global generator: the datasets seed it per sample,
    so an image gets the same augmentation whichever worker or process reads it.
    """
    from torchvision import transforms as T

    steps: list[Callable] = [
        T.Lambda(lambda im: to_mode(im, in_channels)),
        T.RandomResizedCrop(
            _size(image_size),
            scale=tuple(crop_scale),
            ratio=tuple(crop_ratio),
            interpolation=T.InterpolationMode.BILINEAR,
            antialias=True,
        ),
    ]
    if hflip:
        steps.append(T.RandomHorizontalFlip())
    if randaugment:
        steps.append(T.RandAugment(num_ops=randaugment, magnitude=randaugment_magnitude))
    return T.Compose(steps + _finish(mean, std))
