"""Preprocessing as the paper does it (§4.1, Appendix B.1): inception-style random crop and
horizontal flip for training, a resize for evaluation (with the checkpoint's centre crop,
when its config stores one), then pixels normalised with the model's mean/std ((0.5, 0.5,
0.5) maps them to [-1, 1], as in the official code). `model_transform(config)` is the one a
model expects (`vitlab.transform`), and the one every command feeds images through: the
checkpoint's crop, interpolation and resize backend (PIL for timm and vitlab, torchvision's
uint8 tensor kernels for transformers 5.x), recorded in its config when it was imported.

The transforms take a PIL image of any mode (L, RGB, RGBA, P, I;16, ...), a numpy array as
image libraries give one ((H, W) or (H, W, C): uint8 pixels, or floats in [0, 1], read as the
8-bit image they round to), or for
evaluation a uint8 or float (C, H, W) tensor, and return a float tensor (C, H, W); anything
else, and pixels that are NaN or infinite, is refused by `image_input` with what to pass. The evaluation steps and the
augmentations are torchvision's; RandAugment is an option.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from PIL import Image
from torch import Tensor

from vitlab.config.run import CROP_SCALE


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


def image_input(image):
    """One image as the transforms take it (see the module docstring): a PIL image or a
    (C, H, W) tensor as it is, a numpy array (H, W[, C]) a PIL image (uint8 pixels as they are,
    float pixels in [0, 1] times 255, rounded). A TypeError or ValueError names
    anything else: another type, a (C, H, W) array, integers that are not uint8, NaN or inf."""
    import torch

    if isinstance(image, Image.Image):
        return image
    if isinstance(image, np.ndarray):
        return _array_image(image)
    if not isinstance(image, torch.Tensor):
        raise TypeError(f"an image is a PIL image, a numpy array (H, W, C) or a (C, H, W) tensor, not "
                        f"{type(image).__name__}; read a file with vitlab.data.read_image")
    if image.is_floating_point():
        if not bool(torch.isfinite(image).all()):
            raise ValueError("the image tensor holds NaN or infinite values; pass finite pixels")
        return image
    if image.dtype != torch.uint8:
        raise TypeError(f"an image tensor is uint8 (pixels 0-255) or float (0-1), not {str(image.dtype)[6:]}")
    return image


def _array_image(a: np.ndarray) -> Image.Image:
    if not (a.ndim == 2 or a.ndim == 3 and a.shape[-1] in (1, 3, 4)):
        raise ValueError(f"a numpy image is (H, W) or (H, W, C) with C 1, 3 or 4, not of shape {a.shape}; for a (C, H, W) "
                         "array pass array.transpose(1, 2, 0)")
    if a.dtype == np.uint8:
        return Image.fromarray(np.ascontiguousarray(a[..., 0] if a.ndim == 3 and a.shape[-1] == 1 else a))
    if a.dtype.kind != "f":
        raise TypeError(f"a numpy image is uint8 (pixels 0-255) or float (0-1), not {a.dtype}")
    if not np.isfinite(a).all():
        raise ValueError("the numpy image holds NaN or infinite values; pass finite pixels")
    if a.size and (a.min() < 0 or a.max() > 1):
        raise ValueError(f"float pixels run from 0 to 1, not {a.min():g} to {a.max():g}; for 0-255 pass uint8 "
                         "(array.astype(numpy.uint8))")
    return _array_image(np.round(a * 255).astype(np.uint8))  # as a PIL image, the same path as 8-bit pixels


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

    def __repr__(self) -> str:
        return "ToFloat(uint8 / 255)"


class _Mode:
    """Bring a PIL image to the model's channels (tensors are taken as they are)."""

    def __init__(self, in_channels: int):
        self.in_channels = in_channels

    def __call__(self, image):
        image = image_input(image)
        return to_mode(image, self.in_channels) if isinstance(image, Image.Image) else image

    def __repr__(self) -> str:
        return f"Mode({'RGB' if self.in_channels == 3 else 'L'})"


class _Input(_Mode):
    """The image in the form the resize backend takes: a PIL image in the model's mode for
    "pil" (a uint8 tensor is made one, so that it is resized by PIL too), a uint8 (C, H, W)
    tensor for "tensor" (a PIL image is converted first, as transformers' processor does).
    Float tensors pass as they are, to torchvision's tensor kernels."""

    def __init__(self, in_channels: int, backend: str):
        super().__init__(in_channels)
        self.backend = backend

    def __call__(self, image):
        import torch
        from torchvision.transforms.v2 import functional as F

        image = image_input(image)
        if isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and self.backend == "pil":
            image = F.to_pil_image(image)
        if isinstance(image, Image.Image):
            image = to_mode(image, self.in_channels)
            return F.pil_to_tensor(image) if self.backend == "tensor" else image
        return image

    def __repr__(self) -> str:
        return f"Input({'RGB' if self.in_channels == 3 else 'L'}, {self.backend})"


class _ResizeKeepRatio:
    """timm's ResizeKeepRatio for a non-square box (torchvision has no such resize): the image
    scaled by the smaller of the two factors that bring it to the box, so the box is covered."""

    def __init__(self, size: tuple[int, int], interpolation):
        self.size, self.interpolation = size, interpolation

    def __call__(self, image):
        from torchvision.transforms.v2 import functional as F

        _, h, w = F.get_dimensions(image)
        ratio = min(h / self.size[0], w / self.size[1])
        return F.resize(image, [round(h / ratio), round(w / ratio)], self.interpolation, antialias=True)

    def __repr__(self) -> str:
        return f"ResizeKeepRatio(cover {self.size[0]}x{self.size[1]}, {self.interpolation.value})"


class EvalTransform:
    """The evaluation preprocessing: resize, centre crop, [0, 1], normalise.

    torchvision.transforms.v2 steps with the arguments timm's `create_transform` and
    transformers' ViTImageProcessor use (tests/test_data_transforms.py holds them to 1e-6),
    except `_Input` (PIL modes, and the backend) and `_ResizeKeepRatio` (timm's own resize for
    a non-square box), which torchvision does not have. `resize_size` is the box the resize
    aims for (h, w) before the crop to `size`.
    """

    def __init__(self, image_size: int | Sequence[int], mean: Sequence[float] = (0.5, 0.5, 0.5),
                 std: Sequence[float] = (0.5, 0.5, 0.5), in_channels: int = 3, crop_fraction: float = 1.0,
                 crop_mode: str = "squash", interpolation: str = "bilinear", backend: str = "pil"):
        import torch
        from torchvision.transforms import v2

        if crop_mode not in ("squash", "center"):
            raise ValueError(f"crop_mode {crop_mode!r}: use squash or center")
        if backend not in ("pil", "tensor"):
            raise ValueError(f"resize backend {backend!r}: use pil or tensor")
        self.size = _size(image_size)
        self.resize_size = (math.floor(self.size[0] / crop_fraction), math.floor(self.size[1] / crop_fraction))
        self.mean, self.std, self.in_channels = tuple(mean), tuple(std), in_channels
        self.crop_fraction, self.crop_mode, self.interpolation, self.backend = crop_fraction, crop_mode, interpolation, backend
        mode = _interpolation(interpolation)
        if crop_mode == "squash":
            resize = v2.Resize(list(self.resize_size), mode, antialias=True)
        elif self.resize_size[0] == self.resize_size[1]:
            resize = v2.Resize([self.resize_size[0]], mode, antialias=True)  # the shorter side
        else:
            resize = _ResizeKeepRatio(self.resize_size, mode)
        steps = [_Input(in_channels, backend), resize]
        self.crops = self.resize_size != self.size or crop_mode == "center"
        if self.crops:
            steps.append(v2.CenterCrop(list(self.size)))
        steps += [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
        self.steps = v2.Compose(steps)

    def __call__(self, image) -> Tensor:
        return self.steps(image)

    def __repr__(self) -> str:
        (h, w), (rh, rw) = self.size, self.resize_size
        side = ("both sides to" if self.crop_mode == "squash" else
                "the shorter side to" if rh == rw else "the aspect kept, to cover")
        by = "PIL" if self.backend == "pil" else "torchvision on a uint8 tensor"
        crop = f"centre {h}x{w} (crop_fraction {self.crop_fraction:g})" if self.crops else "none"
        numbers = lambda v: "(" + ", ".join(f"{x:g}" for x in v) + ")"  # noqa: E731
        return (f"EvalTransform(\n  size: {h}x{w}, {'RGB' if self.in_channels == 3 else 'L (greyscale)'}\n"
                f"  resize: {side} {rh if self.crop_mode == 'center' and rh == rw else f'{rh}x{rw}'}, {self.interpolation}, antialiased, by {by} (backend {self.backend!r})\n"
                f"  crop: {crop}\n  normalise: (pixel / 255 - mean) / std, mean {numbers(self.mean)}, "
                f"std {numbers(self.std)}\n)")


def eval_transform(
    image_size: int | Sequence[int],
    mean: Sequence[float] = (0.5, 0.5, 0.5),
    std: Sequence[float] = (0.5, 0.5, 0.5),
    in_channels: int = 3,
    crop_fraction: float = 1.0,
    crop_mode: str = "squash",
    interpolation: str = "bilinear",
    backend: str = "pil",
) -> EvalTransform:
    """Resize to image_size / crop_fraction, centre-crop image_size, normalise.

    crop_fraction 1.0 with "squash" is the paper's evaluation: the whole image resized to
    the model's resolution. "center" resizes the shorter side instead and crops the rest
    (timm's default for ImageNet checkpoints, with a fraction of 0.875 or 0.9). The sizes are
    floor(side / crop_fraction), as timm computes them. `backend` says who resizes: "pil"
    (PIL's filters, as timm does; a uint8 tensor is made a PIL image first) or "tensor"
    (torchvision's antialiased kernels on a uint8 tensor, as transformers 5.x's
    ViTImageProcessor does; a PIL image is made a tensor first). Either way the input may be
    a PIL image of any mode or a uint8 (C, H, W) tensor, and the pixels depend on the
    backend only.
    """
    return EvalTransform(image_size, mean, std, in_channels, crop_fraction, crop_mode, interpolation, backend)


def model_transform(config, train: bool = False, **augment) -> Callable[[Image.Image], Tensor]:
    """The preprocessing a model of `config` expects (a ViTConfig or anything with its
    preprocessing fields), the one function every command feeds a model through: evaluation
    as `eval_transform` with the stored crop, interpolation and resize backend, or training
    as `train_transform` at the same size, interpolation and normalisation."""
    common = dict(image_size=config.image_size, mean=config.mean, std=config.std, in_channels=config.in_channels)
    if train:
        return train_transform(**common, interpolation=config.interpolation, **augment)
    if augment:
        raise TypeError(f"augmentation options {sorted(augment)} apply to the training transform (train=True)")
    return eval_transform(**common, crop_fraction=config.crop_fraction, crop_mode=config.crop_mode,
                          interpolation=config.interpolation, backend=getattr(config, "resize_backend", "pil"))


# train_transform's augmentation options, as DataConfig and open_dataset name them.
AUGMENT_OPTIONS = ("crop_scale", "crop_ratio", "hflip", "randaugment", "randaugment_magnitude", "autoaugment",
                   "trivialaugment", "augmix", "random_erasing")


def train_transform(
    image_size: int | Sequence[int],
    mean: Sequence[float] = (0.5, 0.5, 0.5),
    std: Sequence[float] = (0.5, 0.5, 0.5),
    in_channels: int = 3,
    crop_scale: Sequence[float] = CROP_SCALE,
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
    after = [T.RandomErasing(p=random_erasing)] if random_erasing else []  # on the normalised tensor
    return T.Compose(steps + [_ToFloat(), T.Normalize(list(mean), list(std))] + after)
