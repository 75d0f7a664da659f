"""Preprocessing as the paper does it (§4.1, Appendix B.1): inception-style random crop and
horizontal flip for training, a resize for evaluation (with the checkpoint's centre crop,
when its config stores one), then pixels normalised with the model's mean/std ((0.5, 0.5,
0.5) maps them to [-1, 1], as in the official code). `model_transform(config)` is the one a
model expects (`vitlab.transform`).

The transforms take a PIL image of any mode (L, RGB, RGBA, P, I;16, ...), or for evaluation
a uint8 (C, H, W) tensor, and return a float tensor (C, H, W). The augmentations are
torchvision's; RandAugment is an option.
"""

from __future__ import annotations

import math
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


def _interpolation(name: str):
    from torchvision import transforms as T

    modes = {"bilinear": T.InterpolationMode.BILINEAR, "bicubic": T.InterpolationMode.BICUBIC,
             "nearest": T.InterpolationMode.NEAREST}
    if name not in modes:
        raise ValueError(f"interpolation {name!r}: use one of {', '.join(modes)}")
    return modes[name]


class _ToFloat:
    """PIL image or (C, H, W) tensor -> float32 tensor in [0, 1]: uint8 / 255, like
    torchvision's ToTensor, so every path ends in the same values."""

    def __call__(self, image) -> Tensor:
        import torch
        from torchvision.transforms import functional as F

        if isinstance(image, Image.Image):
            image = F.pil_to_tensor(image)
        return F.convert_image_dtype(image, torch.float32)


class _Mode:
    """Bring a PIL image to the model's channels (tensors are taken as they are)."""

    def __init__(self, in_channels: int):
        self.in_channels = in_channels

    def __call__(self, image):
        return to_mode(image, self.in_channels) if isinstance(image, Image.Image) else image


class _Resize:
    """torchvision.transforms.v2's resize: PIL's own filter for a PIL image (what timm and
    HF's PIL processor call), the native uint8 kernel for a uint8 tensor (what HF's default
    processor calls). `size` is (h, w) to squash, or the box the shorter side must cover
    ("center": aspect ratio kept; a square box is torchvision's Resize(int))."""

    def __init__(self, size: tuple[int, int], interpolation, keep_ratio: bool):
        self.size, self.interpolation, self.keep_ratio = size, interpolation, keep_ratio

    def __call__(self, image):
        from torchvision.transforms.v2 import functional as F

        size: list[int] = list(self.size)
        if self.keep_ratio:
            _, h, w = F.get_dimensions(image)
            if self.size[0] == self.size[1]:
                size = [self.size[0]]
            else:  # timm's ResizeKeepRatio: the smaller of the two scale factors
                ratio = min(h / self.size[0], w / self.size[1])
                size = [round(h / ratio), round(w / ratio)]
        return F.resize(image, size, self.interpolation, antialias=True)


class _CenterCrop:
    def __init__(self, size: tuple[int, int]):
        self.size = list(size)

    def __call__(self, image):
        from torchvision.transforms.v2 import functional as F

        return F.center_crop(image, self.size)


def _finish(mean: Sequence[float], std: Sequence[float]) -> list[Callable]:
    from torchvision import transforms as T

    return [_ToFloat(), T.Normalize(list(mean), list(std))]


def eval_transform(
    image_size: int | Sequence[int],
    mean: Sequence[float] = (0.5, 0.5, 0.5),
    std: Sequence[float] = (0.5, 0.5, 0.5),
    in_channels: int = 3,
    crop_fraction: float = 1.0,
    crop_mode: str = "squash",
    interpolation: str = "bilinear",
) -> Callable[[Image.Image], Tensor]:
    """Resize to image_size / crop_fraction, centre-crop image_size, normalise.

    crop_fraction 1.0 with "squash" is the paper's evaluation: the whole image resized to
    the model's resolution. "center" resizes the shorter side instead and crops the rest
    (timm's default for ImageNet checkpoints, with a fraction of 0.875 or 0.9). The sizes are
    floor(side / crop_fraction), as timm computes them. Takes a PIL image (resized by PIL, as
    timm and HF's PIL processor do) or a (C, H, W) tensor (resized by torchvision's tensor
    kernels, as HF's default processor does).
    """
    from torchvision import transforms as T

    if crop_mode not in ("squash", "center"):
        raise ValueError(f"crop_mode {crop_mode!r}: use squash or center")
    size = _size(image_size)
    scale = (math.floor(size[0] / crop_fraction), math.floor(size[1] / crop_fraction))
    steps = [_Mode(in_channels), _Resize(scale, _interpolation(interpolation), keep_ratio=crop_mode == "center")]
    if scale != size or crop_mode == "center":
        steps.append(_CenterCrop(size))
    return T.Compose(steps + _finish(mean, std))


def model_transform(config, train: bool = False, **augment) -> Callable[[Image.Image], Tensor]:
    """The preprocessing a model of `config` expects (a ViTConfig or anything with its
    preprocessing fields): evaluation as `eval_transform` with the stored crop, or training
    as `train_transform` at the same size, interpolation and normalisation."""
    common = dict(image_size=config.image_size, mean=config.mean, std=config.std, in_channels=config.in_channels)
    if train:
        return train_transform(**common, interpolation=config.interpolation, **augment)
    if augment:
        raise TypeError(f"augmentation options {sorted(augment)} apply to the training transform (train=True)")
    return eval_transform(**common, crop_fraction=config.crop_fraction, crop_mode=config.crop_mode,
                          interpolation=config.interpolation)


# train_transform's augmentation options, as DataConfig and open_dataset name them.
AUGMENT_OPTIONS = ("crop_scale", "crop_ratio", "hflip", "randaugment", "randaugment_magnitude", "autoaugment",
                   "trivialaugment", "augmix", "random_erasing")


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
    interpolation: str = "bilinear",
    autoaugment: str = "",
    trivialaugment: bool = False,
    augmix: int = 0,
    random_erasing: float = 0.0,
) -> Callable[[Image.Image], Tensor]:
    """Inception-style crop (random area and aspect ratio, resized to the model's size) and
    a horizontal flip (Appendix B.1); then, each when set, torchvision's RandAugment
    (num_ops=randaugment), AutoAugment (the `autoaugment` policy: imagenet, cifar10, svhn),
    TrivialAugmentWide and AugMix (severity=augmix) on the image, and RandomErasing
    (p=random_erasing) on the normalised tensor.

    The random numbers come from torch's global generator: the datasets seed it per sample,
    so an image gets the same augmentation whichever worker or process reads it.
    """
    from torchvision import transforms as T

    steps: list[Callable] = [
        _Mode(in_channels),
        T.RandomResizedCrop(
            _size(image_size),
            scale=tuple(crop_scale),
            ratio=tuple(crop_ratio),
            interpolation=_interpolation(interpolation),
            antialias=True,
        ),
    ]
    if hflip:
        steps.append(T.RandomHorizontalFlip())
    if randaugment:
        steps.append(T.RandAugment(num_ops=randaugment, magnitude=randaugment_magnitude))
    if autoaugment:
        steps.append(T.AutoAugment(T.AutoAugmentPolicy(autoaugment)))
    if trivialaugment:
        steps.append(T.TrivialAugmentWide())
    if augmix:
        steps.append(T.AugMix(severity=augmix))
    after = [T.RandomErasing(p=random_erasing)] if random_erasing else []
    return T.Compose(steps + _finish(mean, std) + after)
