"""Preprocessing as the paper does it (§4.1, Appendix B.1): inception-style random crop and
horizontal flip for training, a resize for evaluation (with the checkpoint's centre crop,
when its config stores one), then pixels normalised with the model's mean/std ((0.5, 0.5,
0.5) maps them to [-1, 1], as in the official code). `model_transform(config)` is the one a
model expects (`vitlab.transform`), and the one every command feeds images through: the
checkpoint's crop, interpolation and resize backend (PIL for timm and vitlab, torchvision's
uint8 tensor kernels for transformers 5.x), recorded in its config when it was imported.

One training transform, `TrainTransform`, whatever decodes the image:

    decode (a step: pil, fast or cuda; vitlab.data.decode)  ->  the Inception crop's box
    drawn on the shown size (or, crop="whole", the whole image)  ->  the crop at the model's size  ->  the flip  ->  the
    augmentations (config.run.AUGMENTATIONS, built here from that table)  ->  uint8 out, or
    normalised (vitlab.pixels)  ->  the augmentations on the float image (random erasing)

`train_transform(..., decode="fast")` builds it; `model_transform(config, train=True)`, what
`vitlab.transform(model, train=True)` returns, is the fast path `vitlab train` uses (decode=fast,
its pixels normalised in the transform).

The transforms take a PIL image of any mode (L, RGB, RGBA, P, I;16, ...), a numpy array as
image libraries give one ((H, W) or (H, W, C): uint8 pixels, or floats in [0, 1], read as the
8-bit image they round to), a uint8 or float (C, H, W) tensor, or an encoded image (a vitlab
dataset's `Encoded`: decoded as the step says), and return a float tensor (C, H, W); anything
else, and pixels that are NaN or infinite, is refused by `image_input` with what to pass.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vitlab.config.model import as_pair
from vitlab.config.preprocessing import eval_recipe
from vitlab.config.run import AUGMENTATIONS, CROP_SCALE, CROPS
from vitlab.data import decode as decoding
from vitlab.data.decode import STEPS, FastEvalTransform, Planned, interpolation_mode
from vitlab.data.images import to_mode
from vitlab.pixels import Normalise


def image_input(image):
    """One image as the transforms take it (see the module docstring): a PIL image or a
    (C, H, W) tensor as it is, a numpy array (H, W[, C]) a PIL image (uint8 pixels as they are,
    float pixels in [0, 1] times 255, rounded). A TypeError or ValueError names
    anything else: another type, a (C, H, W) array, integers that are not uint8, NaN or inf."""
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
        raise ValueError(f"float pixels run from 0 to 1, not {a.min():g} to {a.max():g}; for 0-255 pass uint8")
    return _array_image(np.round(a * 255).astype(np.uint8))  # as a PIL image, the same path as 8-bit pixels


def _size(image_size: int | Sequence[int]) -> tuple[int, int]:
    h, w = as_pair(image_size)
    return int(h), int(w)


class _Input:
    """The image in the form the resize backend takes: a PIL image in the model's mode for
    "pil" (a uint8 tensor is made one, so that it is resized by PIL too), a uint8 (C, H, W)
    tensor for "tensor" (a PIL image is converted first, as transformers' processor does).
    Float tensors pass as they are, to torchvision's tensor kernels."""

    def __init__(self, in_channels: int, backend: str):
        self.in_channels, self.backend = in_channels, backend

    def __call__(self, image):
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

    def __init__(self, size: tuple[int, int], interpolation, antialias: bool = True):
        self.size, self.interpolation, self.antialias = size, interpolation, antialias

    def __call__(self, image):
        from torchvision.transforms.v2 import functional as F

        _, h, w = F.get_dimensions(image)
        ratio = min(h / self.size[0], w / self.size[1])
        return F.resize(image, [round(h / ratio), round(w / ratio)], self.interpolation, antialias=self.antialias)

    def __repr__(self) -> str:
        return f"ResizeKeepRatio(cover {self.size[0]}x{self.size[1]}, {self.interpolation.value})"


class EvalTransform:
    """The evaluation preprocessing: resize, centre crop, [0, 1], normalise.

    torchvision.transforms.v2 steps with the arguments timm's `create_transform` and
    transformers' ViTImageProcessor use (tests/test_data_transforms.py holds them to 1e-6),
    except `_Input` (PIL modes, and the backend) and `_ResizeKeepRatio` (timm's own resize for
    a non-square box), which torchvision does not have. `resize_size` is the box the resize
    aims for (h, w) before the crop to `size`. antialias=False resizes a uint8 tensor (PIL
    always filters) with no filter, as TF's tf.image.resize does by default. `eval_transform` is
    this class by the name the commands call it.

    Resizes to image_size / crop_fraction and centre-crops image_size: crop_fraction 1.0 with "squash" is the paper's evaluation: the whole image resized to
    the model's resolution. "center" resizes the shorter side instead and crops the rest
    (timm's default for ImageNet checkpoints, with a fraction of 0.875 or 0.9). The sizes are
    floor(side / crop_fraction), as timm computes them. `backend` says who resizes: "pil"
    (PIL's filters, as timm does; a uint8 tensor is made a PIL image first) or "tensor"
    (torchvision's antialiased kernels on a uint8 tensor, as transformers 5.x's
    ViTImageProcessor does; a PIL image is made a tensor first). Either way the input may be
    a PIL image of any mode or a uint8 (C, H, W) tensor, and the pixels depend on the
    backend only. antialias=False (data.antialias): the "tensor" backend's kernels without
    their filter, TF's tf.image.resize default.
    """

    def __init__(self, image_size: int | Sequence[int], mean: Sequence[float] = (0.5, 0.5, 0.5),
                 std: Sequence[float] = (0.5, 0.5, 0.5), in_channels: int = 3, crop_fraction: float = 1.0,
                 crop_mode: str = "squash", interpolation: str = "bilinear", backend: str = "pil", antialias: bool = True):
        from torchvision.transforms import v2

        if crop_mode not in ("squash", "center"):
            raise ValueError(f"crop_mode {crop_mode!r}: use squash or center")
        if backend not in ("pil", "tensor"):
            raise ValueError(f"resize backend {backend!r}: use pil or tensor")
        self.size = _size(image_size)
        backend = backend if antialias else "tensor"
        self.recipe = eval_recipe(image_size, mean, std, in_channels, crop_fraction, crop_mode, interpolation, backend,
                                  antialias)
        self.resize_size = tuple(self.recipe["resize_size"])
        self.mean, self.std, self.in_channels = tuple(mean), tuple(std), in_channels
        self.crop_fraction, self.crop_mode, self.interpolation, self.backend = crop_fraction, crop_mode, interpolation, backend
        self.antialias = antialias
        mode = interpolation_mode(interpolation)
        if crop_mode == "squash":
            resize = v2.Resize(list(self.resize_size), mode, antialias=antialias)
        elif self.resize_size[0] == self.resize_size[1]:
            resize = v2.Resize([self.resize_size[0]], mode, antialias=antialias)  # the shorter side
        else:
            resize = _ResizeKeepRatio(self.resize_size, mode, antialias)
        steps = [_Input(in_channels, backend), resize]
        self.crops = self.recipe["crop"] is not None
        if self.crops:
            steps.append(v2.CenterCrop(list(self.size)))
        steps += [v2.PILToTensor(), Normalise(mean, std)]  # vitlab.pixels: the one normaliser
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
                f"  resize: {side} {rh if self.crop_mode == 'center' and rh == rw else f'{rh}x{rw}'}, {self.interpolation}, "
                f"{'antialiased' if self.antialias else 'not antialiased'}, by {by} (backend {self.backend!r})\n"
                f"  crop: {crop}\n  normalise: (pixel / 255 - mean) / std, mean {numbers(self.mean)}, "
                f"std {numbers(self.std)}\n)")


eval_transform = EvalTransform  # (the name every caller uses)


def model_transform(config, train: bool = False, antialias: bool = True, **augment) -> Callable[[Image.Image], Tensor]:
    """The preprocessing a model of `config` expects (a ViTConfig or anything with its
    preprocessing fields), the one function every command feeds a model through: evaluation
    as `eval_transform` with the stored crop, interpolation and resize backend, or training
    as `train_transform` at the same size, interpolation and normalisation, on the fast path
    `vitlab train` takes (decode="fast"; `augment` may name another decode). `antialias`
    (data.antialias): False resizes as TF's tf.image.resize does by default, no filter."""
    common = dict(image_size=config.image_size, mean=config.mean, std=config.std, in_channels=config.in_channels,
                  antialias=antialias)
    if train:
        return train_transform(**common, interpolation=config.interpolation, **augment)
    if augment:
        raise TypeError(f"augmentation options {sorted(augment)} apply to the training transform (train=True)")
    return eval_transform(**common, crop_fraction=config.crop_fraction, crop_mode=config.crop_mode,
                          interpolation=config.interpolation, backend=getattr(config, "resize_backend", "pil"))


# train_transform's augmentation options, as DataConfig names them: the crop and flip, then the table's.
AUGMENT_OPTIONS = ("crop", "crop_scale", "crop_ratio", "hflip", *(key for a in AUGMENTATIONS for key in a.keys))


def augmentations(options: dict[str, Any]) -> tuple[list[Callable], list[Callable]]:
    """(on the image, on the normalised float image): the torchvision transforms of each
    augmentation of config.run.AUGMENTATIONS that `options` turns on, in the table's order. An
    argument whose default is an enum (AutoAugment's policy) is given as that enum."""
    from torchvision import transforms as T

    image: list[Callable] = []
    after: list[Callable] = []
    for a in AUGMENTATIONS:
        if not options.get(a.option):
            continue
        op = getattr(T, a.op)
        defaults = inspect.signature(op).parameters
        args = {}
        for arg, key in a.args.items():  # a key not given: torchvision's default
            default = defaults[arg].default
            value = options.get(key, default)
            args[arg] = type(default)(value) if hasattr(type(default), "__members__") else value
        (after if a.on_float else image).append(op(**args))
    return image, after


class TrainTransform:
    """The training transform (see the module docstring): `decode` one of decode.STEPS; uint8
    (C, H, W) out with `uint8` (the loader's batches, normalised by the training process on
    its device) unless an augmentation runs on the float image, else normalised float32; for
    decode="cuda" a `decode.Planned` item. The random draws (box, flip, augmentations) come
    from torch's global generator in torchvision's order: datasets seed it per item, so an image
    gets the same augmentation whichever worker or process reads it, and whatever decodes it."""

    takes_encoded = True

    def __init__(self, image_size: int | Sequence[int], mean: Sequence[float] = (0.5, 0.5, 0.5),
                 std: Sequence[float] = (0.5, 0.5, 0.5), in_channels: int = 3,
                 crop_scale: Sequence[float] = CROP_SCALE, crop_ratio: Sequence[float] = (3 / 4, 4 / 3),
                 hflip: bool = True, interpolation: str = "bilinear", decode: str = "fast", uint8: bool = False,
                 crop: str = "inception", antialias: bool = True, **augment: Any):
        if decode not in STEPS:
            raise ValueError(f"decode={decode!r}: use one of {', '.join(STEPS)}")
        if crop not in CROPS:
            raise ValueError(f"crop={crop!r}: use one of {', '.join(CROPS)}")
        unknown = sorted(set(augment) - set(AUGMENT_OPTIONS))
        if unknown:
            raise TypeError(f"unknown augmentation option(s) {unknown}; known: {', '.join(AUGMENT_OPTIONS)}")
        self.size = _size(image_size)
        self.mean, self.std, self.in_channels = tuple(mean), tuple(std), in_channels
        self.decode, self.uint8, self.interpolation = decode, uint8, interpolation_mode(interpolation)
        self.crop, self.antialias = crop, antialias
        self.draw = (functools.partial(decoding.whole_box, hflip=hflip) if crop == "whole" else
                     functools.partial(decoding.draw_box, scale=tuple(crop_scale), ratio=tuple(crop_ratio), hflip=hflip))
        self.ops, self.after = augmentations(augment)
        if decode == "cuda" and (self.ops or self.after):
            raise ValueError(f"{', '.join(sorted(k for k in augment if augment[k]))} run on the CPU: use decode=fast "
                             "(data.decode=fast) with them")
        self.normalise = Normalise(mean, std)
        self.described = (crop_scale, crop_ratio, hflip, interpolation)

    def __call__(self, image: Any) -> Any:
        if not isinstance(image, decoding.Encoded):
            image = image_input(image)  # a numpy array as a PIL image; NaN, inf and other types refused
        x, box = STEPS[self.decode](image, self.draw, self.size, self.interpolation, self.in_channels, self.antialias)
        if isinstance(x, Planned):
            return x
        if box.flip:
            x = x.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if isinstance(x, Image.Image) else x.flip(-1)
        for op in self.ops:
            x = op(x)
        if isinstance(x, Image.Image):
            from torchvision.transforms.functional import pil_to_tensor

            x = pil_to_tensor(x)
        if self.uint8 and not self.after and x.dtype == torch.uint8:
            return x
        y = self.normalise(x)
        for op in self.after:
            y = op(y)
        return y

    @property
    def augmentations(self) -> list[Callable]:
        """The torchvision transforms it runs after the crop and flip, in order."""
        return [*self.ops, *self.after]

    def __repr__(self) -> str:
        (h, w), (scale, ratio, hflip, interpolation) = self.size, self.described
        ops = ", ".join(type(op).__name__ for op in [*self.ops, *self.after]) or "none"
        crop = ("none, the whole image" if self.crop == "whole" else
                f"Inception, area {scale[0]:g}-{scale[1]:g}, aspect {ratio[0]:.3g}-{ratio[1]:.3g}")
        return (f"TrainTransform(\n  decode: {self.decode} (vitlab.data.decode)\n  crop: {crop}, "
                f"resized to {h}x{w}, {interpolation}, {'antialiased' if self.antialias else 'not antialiased'}\n"
                f"  flip: {'horizontal, half the images' if hflip else 'none'}\n  augmentations: {ops}\n"
                f"  out: {'uint8 (normalised on the device)' if self.uint8 and not self.after else repr(self.normalise)}\n)")


def train_transform(image_size: int | Sequence[int], mean: Sequence[float] = (0.5, 0.5, 0.5),
                    std: Sequence[float] = (0.5, 0.5, 0.5), in_channels: int = 3, decode: str = "fast",
                    uint8: bool = False, **augment: Any) -> TrainTransform:
    """The training transform: the Inception crop (random area `crop_scale` and aspect ratio
    `crop_ratio`, resized to the model's size), or with crop="whole" the whole image resized
    to it (VTAB's geometry, the evaluation squash's), and a horizontal flip (Appendix B.1); then,
    each when set, the augmentations of config.run.AUGMENTATIONS (torchvision's RandAugment
    with num_ops=randaugment, AutoAugment with the `autoaugment` policy, TrivialAugmentWide,
    AugMix with severity=augmix, RandomErasing with p=random_erasing on the normalised image).
    `decode`: "fast" (the default: a JPEG decoded at the scale its crop needs), "pil"
    (decoded, cropped and resized by PIL, as torchvision does), "cuda" (on the GPU)."""
    return TrainTransform(image_size, mean, std, in_channels, decode=decode, uint8=uint8, **augment)


def fast_model_transform(config: Any, antialias: bool = True) -> FastEvalTransform | EvalTransform:
    """`transforms.model_transform(config)` for evaluation, fed at the reduced scale (opt-in)."""
    return fast_eval_transform(config.image_size, config.mean, config.std, config.in_channels, config.crop_fraction,
                               config.crop_mode, config.interpolation, backend=getattr(config, "resize_backend", "pil"),
                               antialias=antialias)


def fast_eval_transform(image_size: Any, mean: Sequence[float] = (0.5, 0.5, 0.5), std: Sequence[float] = (0.5, 0.5, 0.5),
                        in_channels: int = 3, crop_fraction: float = 1.0, crop_mode: str = "squash",
                        interpolation: str = "bilinear", margin: int = 2, backend: str = "pil",
                        antialias: bool = True) -> FastEvalTransform | EvalTransform:
    """`eval_transform`, fed by a JPEG decoded at the largest reduction that leaves `margin` times
    the size its resize makes (2: within 0.1 point of top-1 of the full decode, where 1 was not;
    benchmarks/results/decode-accuracy.md)."""
    inner = eval_transform(image_size, mean, std, in_channels, crop_fraction, crop_mode, interpolation, backend, antialias)
    if not antialias:  # a reduced decode filters: without antialiasing, the full decode
        return inner
    return FastEvalTransform(inner, inner.resize_size, keep_ratio=crop_mode == "center", margin=margin)
