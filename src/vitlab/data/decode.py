"""Decode only what the crop needs, and keep the pixels uint8 until the training process.

A JPEG is stored as 8x8 DCT blocks, and libjpeg can decode it at 1/2, 1/4 or 1/8 of its size
for a fraction of the work (PIL's `Image.draft`). When the crop is known before decoding --
the Inception crop's box is drawn from the image's size alone, the evaluation resize is a
function of it -- the image is decoded at the smallest of those scales at which the crop
still has at least the output's pixels, so the resize that follows still shrinks (or
keeps) and never enlarges what the full decode would have shrunk.

`FastTrainTransform` is the training transform of `transforms.train_transform` (the same
crop and flip, drawn from torch's generator in the same order, so one seed gives the same
box and flip), done on uint8 tensors: the crop is cut in PIL, resized by torch's uint8
antialiased kernel and flipped, and stays uint8 (C, H, W) -- a quarter of a float image
through the workers' shared memory. `Normalise` turns a uint8 batch into the model's input
in the training process, or on the device. `FastEvalTransform` decodes at the reduced scale
and then runs the evaluation transform unchanged; its pixels differ from a full decode (by
the mean absolute difference `benchmarks/pipeline.py` reports), so it is opt-in: evaluation
by default decodes in full, as timm and Hugging Face do.

`plan_crops` and `decode_planned` are the GPU path: the boxes and flips are drawn on the CPU
from the same seeds, the bytes go to the device, and `torchvision.io.decode_jpeg(device=
"cuda")` decodes a batch there, where it is cropped, resized, flipped and normalised.
"""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np
import torch
from PIL import Image

from vitlab.config.run import CROP_SCALE
from vitlab.data.datasets import Encoded, bad_image, decoded
from vitlab.data.transforms import _interpolation, _size, eval_transform, to_mode, train_transform
from vitlab.files import NotRegularFileError, require_regular_file

SCALES = (8, 4, 2, 1)
# EXIF orientations that turn the stored image a quarter: its width is the shown height.
TRANSPOSED = (5, 6, 7, 8)


def dct_scale(box: tuple[int, int], out: tuple[int, int], margin: int = 1) -> int:
    """The largest of 8, 4, 2, 1 that leaves a (h, w) crop box at least `margin` times the (h, w) output."""
    return next((s for s in SCALES if box[0] // s >= margin * out[0] and box[1] // s >= margin * out[1]), 1)


def read_encoded(image: Encoded) -> bytes:
    """The encoded bytes, with `read_image`'s check that a path is a regular file."""
    source = image.source
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    try:
        require_regular_file(source, "image file")
    except NotRegularFileError as e:
        raise bad_image(image.name, ValueError(f"it is {e.kind}, not a regular file")) from None
    return Path(source).read_bytes()


# Start-of-frame markers (baseline, extended, progressive, lossless; Huffman or arithmetic).
SOF = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))


def jpeg_header(data: bytes) -> Optional[tuple[int, int, int, bool]]:
    """(height, width, components, has EXIF) read from a JPEG's markers up to its frame header,
    or None where they cannot be read so (then PIL reads the file). A tenth of PIL's open."""
    if data[:2] != b"\xff\xd8":
        return None
    i, n, exif = 2, len(data), False
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in SOF:
            if i + 10 > n:
                return None
            return int.from_bytes(data[i + 5:i + 7], "big"), int.from_bytes(data[i + 7:i + 9], "big"), data[i + 9], exif
        if marker in (0xDA, 0xD9):  # a scan or the end before any frame header
            return None
        exif = exif or (marker == 0xE1 and data[i + 4:i + 10] == b"Exif\0\0")
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


def open_lazy(image: Encoded, data: Optional[bytes] = None) -> tuple[Image.Image, bytes]:
    """An image opened without decoding its pixels (the caller decodes, after a `draft`) and its
    bytes, read once; PIL's decompression-bomb limit applies as in `read_image`."""
    data = read_encoded(image) if data is None else data
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data)), data
    except Exception as e:
        raise bad_image(image.name, e) from None


def orientation(im: Image.Image) -> int:
    """The EXIF orientation (1: as stored); 1 for a broken EXIF block, which decoded() ignores."""
    try:
        return int(im.getexif().get(0x0112, 1))
    except Exception:
        return 1


def shown_size(im: Image.Image) -> tuple[int, int]:
    """(height, width) as shown: after the EXIF orientation that `decoded` applies."""
    return (im.width, im.height) if orientation(im) in TRANSPOSED else (im.height, im.width)


def decode_at(im: Image.Image, scale: int, name: str) -> Image.Image:
    """Decode an opened image at 1/scale of its size (JPEG; other formats in full), upright,
    as `datasets.decoded` does, without its copy when nothing needs turning."""
    try:
        if scale > 1 and im.format == "JPEG" and im.width >= scale and im.height >= scale:
            im.draft(None, (im.width // scale, im.height // scale))
        if orientation(im) != 1 or im.mode == "P":
            return decoded(im)
        im.load()  # PIL closes a file it opened itself once the pixels are read
        if im.width < 1 or im.height < 1:
            raise ValueError(f"the image is {im.width}x{im.height} pixels")
        return im
    except Exception as e:
        raise bad_image(name, e) from None


def jpeg_tensor(data: bytes, name: str, in_channels: int) -> Optional[torch.Tensor]:
    """torchvision.io.decode_jpeg of the bytes as uint8 (C, H, W); None without it (torchvision's
    decoders are deprecated for torchcodec and may go)."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                               mode=ImageReadMode.RGB if in_channels == 3 else ImageReadMode.GRAY)
    except RuntimeError as e:
        raise bad_image(name, e) from None


def decode_uint8(im: Image.Image, data: bytes, name: str, scale: int, in_channels: int) -> torch.Tensor:
    """uint8 (C, H, W) of an opened image at 1/scale, in the model's channels. A JPEG needing
    no reduction, no turn and no colour conversion goes to torchvision.io.decode_jpeg (the same
    libjpeg-turbo pixels, one copy fewer); everything else to PIL."""
    plain = (im.mode == "RGB" and in_channels == 3) or (im.mode == "L" and in_channels == 1)
    if scale == 1 and im.format == "JPEG" and plain and orientation(im) == 1:
        x = jpeg_tensor(data, name, in_channels)
        if x is not None:
            return x
    return to_uint8(to_mode(decode_at(im, scale, name), in_channels))


def to_uint8(image: Image.Image) -> torch.Tensor:
    """An L or RGB PIL image as a uint8 (C, H, W) tensor (one copy)."""
    a = torch.from_numpy(np.array(image))
    return a[None] if a.ndim == 2 else a.permute(2, 0, 1)


class Box(NamedTuple):
    """A crop (top, left, height, width) in the shown image's pixels, and the flip."""

    top: int
    left: int
    height: int
    width: int
    flip: bool


def draw_box(height: int, width: int, scale: Sequence[float], ratio: Sequence[float], hflip: bool) -> Box:
    """torchvision's RandomResizedCrop box, then RandomHorizontalFlip's coin, drawn from torch's
    global generator in that order: the same draws as `transforms.train_transform`."""
    from torchvision import transforms as T

    shape_only = torch.empty(1, 1, 1, dtype=torch.uint8).expand(1, height, width)
    i, j, h, w = T.RandomResizedCrop.get_params(shape_only, list(scale), list(ratio))
    flip = bool(torch.rand(1) < 0.5) if hflip else False
    return Box(i, j, h, w, flip)


def scaled(box: Box, full: tuple[int, int], now: tuple[int, int]) -> tuple[int, int, int, int]:
    """The box (left, upper, right, lower) in an image decoded at (h, w) = `now` from `full`."""
    fy, fx = now[0] / full[0], now[1] / full[1]
    top, left = round(box.top * fy), round(box.left * fx)
    bottom = max(top + 1, min(now[0], round((box.top + box.height) * fy)))
    right = max(left + 1, min(now[1], round((box.left + box.width) * fx)))
    return left, top, right, bottom


class Normalise:
    """uint8 (..., C, H, W) -> float32 ((x / 255) - mean) / std, on whatever device x is."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8:
            return x
        # (x - 255 mean) * (1 / (255 std)) in place on the float copy, channel by channel with
        # scalars (broadcast tensors take a slower path on the CPU): the float path to 1e-6
        y = x.to(torch.float32)
        for c, (m, s) in enumerate(zip(self.mean, self.std)):
            y[..., c, :, :].sub_(255.0 * m).mul_(1.0 / (255.0 * s))
        return y


class FastTrainTransform:
    """The Inception crop and flip of `train_transform`, decoding only what the crop needs.

    Takes an `Encoded` image (decoded here, at the reduced scale) or a PIL image; returns uint8
    (C, H, W), or the normalised float image with `uint8=False`."""

    takes_encoded = True

    def __init__(self, size: tuple[int, int], mean: Sequence[float], std: Sequence[float], in_channels: int = 3,
                 crop_scale: Sequence[float] = CROP_SCALE, crop_ratio: Sequence[float] = (3 / 4, 4 / 3),
                 hflip: bool = True, randaugment: int = 0, randaugment_magnitude: int = 9,
                 interpolation: Any = None, uint8: bool = True):
        from torchvision import transforms as T

        self.size, self.in_channels, self.uint8 = tuple(size), in_channels, uint8
        self.crop_scale, self.crop_ratio, self.hflip = tuple(crop_scale), tuple(crop_ratio), hflip
        self.interpolation = interpolation or T.InterpolationMode.BILINEAR
        self.bilinear = self.interpolation == T.InterpolationMode.BILINEAR
        self.randaugment = T.RandAugment(num_ops=randaugment, magnitude=randaugment_magnitude) if randaugment else None
        self.normalise = Normalise(mean, std)

    def __call__(self, image: Any) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as F

        if isinstance(image, Encoded):
            x, full, box = self.decode(image)
        else:
            full = (image.height, image.width)
            box = draw_box(*full, self.crop_scale, self.crop_ratio, self.hflip)
            x = to_uint8(to_mode(image, self.in_channels))
        left, top, right, bottom = scaled(box, full, tuple(x.shape[-2:]))
        # the crop copied to one channels-last block: torch's uint8 kernel runs a third faster on it
        crop = x[None, :, top:bottom, left:right].contiguous(memory_format=torch.channels_last)
        if self.bilinear:  # torch's native uint8 kernel, called directly
            x = torch.nn.functional.interpolate(crop, self.size, mode="bilinear", align_corners=False, antialias=True)[0]
        else:
            x = F.resize(crop, list(self.size), self.interpolation, antialias=True)[0]
        if box.flip:
            x = x.flip(-1)
        if self.randaugment is not None:
            x = self.randaugment(x)
        return x if self.uint8 else self.normalise(x)


    def decode(self, image: Encoded) -> tuple[torch.Tensor, tuple[int, int], Box]:
        """(uint8 pixels at the scale the crop needs, the shown (h, w), the box drawn on it)."""
        data = read_encoded(image)
        header = jpeg_header(data)
        if header is not None and not header[3] and header[2] == self.in_channels and min(header[:2]) > 0:
            full = header[:2]  # no EXIF block, so no turn: the header's size is the shown size
            if full[0] * full[1] > Image.MAX_IMAGE_PIXELS:  # as read_image: refused, not decoded
                raise bad_image(image.name, ValueError(f"{full[1]}x{full[0]} pixels, over PIL's decompression-bomb "
                                                       f"limit of {Image.MAX_IMAGE_PIXELS:,}"))
            box = draw_box(*full, self.crop_scale, self.crop_ratio, self.hflip)
            x = jpeg_tensor(data, image.name, self.in_channels) if dct_scale(box[2:4], self.size) == 1 else None
            if x is not None and tuple(x.shape[-2:]) == full:
                return x, full, box
            im, _ = open_lazy(image, data)
            return decode_uint8(im, data, image.name, dct_scale(box[2:4], self.size), self.in_channels), full, box
        im, _ = open_lazy(image, data)
        full = shown_size(im)
        box = draw_box(*full, self.crop_scale, self.crop_ratio, self.hflip)
        return decode_uint8(im, data, image.name, dct_scale(box[2:4], self.size), self.in_channels), full, box


class FastEvalTransform:
    """An evaluation transform (a torchvision Compose from `eval_transform`) fed by an image
    decoded at the largest DCT reduction that still leaves `margin` times what its resize makes
    (`resize_to`, h, w: the size before its crop, or its output). Opt-in: the pixels differ from
    a full decode by a little (see the module docstring)."""

    takes_encoded = True

    def __init__(self, transform: Callable, resize_to: tuple[int, int], keep_ratio: bool, margin: int = 2):
        self.transform, self.resize_to, self.keep_ratio = transform, tuple(resize_to), keep_ratio
        self.margin = margin

    def needed(self, full: tuple[int, int]) -> tuple[int, int]:
        """The (h, w) the resize makes of a shown (h, w) image."""
        if not self.keep_ratio:
            return self.resize_to
        r = max(self.resize_to[0] / full[0], self.resize_to[1] / full[1])
        return (round(full[0] * r), round(full[1] * r))

    def __call__(self, image: Any) -> torch.Tensor:
        if isinstance(image, Encoded):
            im, _ = open_lazy(image)
            full = shown_size(im)
            image = decode_at(im, dct_scale(full, self.needed(full), self.margin), image.name)
        return self.transform(image)


# The GPU path --------------------------------------------------------------------------
class Planned(NamedTuple):
    """One training image for the device: its JPEG bytes (encoded=True) or, for what nvjpeg
    does not take (other formats, CMYK, an EXIF rotation, images held in memory), its pixels
    decoded on the CPU, uint8 (C, H, W); and the box and flip drawn for it."""

    data: torch.Tensor
    box: Box
    shown: tuple[int, int]
    encoded: bool


class PlanTransform:
    """For `data.decode=cuda`: reads a JPEG's header, draws the crop and flip as the CPU path
    does (the same draws for the same seed), and leaves decoding to the device (`decode_planned`)."""

    takes_encoded = True

    def __init__(self, crop_scale: Sequence[float], crop_ratio: Sequence[float], hflip: bool, in_channels: int = 3):
        self.crop_scale, self.crop_ratio, self.hflip = tuple(crop_scale), tuple(crop_ratio), hflip
        self.in_channels = in_channels

    def __call__(self, image: Any) -> Planned:
        if isinstance(image, Encoded):
            im, data = open_lazy(image)
            full = shown_size(im)
            if im.format == "JPEG" and im.mode in ("RGB", "L") and full == (im.height, im.width):
                box = draw_box(*full, self.crop_scale, self.crop_ratio, self.hflip)
                return Planned(torch.frombuffer(bytearray(data), dtype=torch.uint8), box, full, True)
            image = decode_at(im, 1, image.name)
        pixels = to_uint8(to_mode(image, self.in_channels))
        full = tuple(pixels.shape[-2:])
        return Planned(pixels, draw_box(*full, self.crop_scale, self.crop_ratio, self.hflip), full, False)


def decode_planned(items: Sequence[Planned], size: tuple[int, int], device: Any, normalise: Optional[Normalise] = None,
                   interpolation: Any = None, in_channels: int = 3) -> torch.Tensor:
    """Decode, crop, resize and flip a batch of planned images on `device` (CUDA: nvjpeg through
    torchvision.io.decode_jpeg; the CPU runs the same operations, which is how it is tested).
    Returns uint8 (B, C, H, W), or the normalised float batch with `normalise`."""
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    mode = ImageReadMode.RGB if in_channels == 3 else ImageReadMode.GRAY
    device = torch.device(device)
    jpegs = [p.data for p in items if p.encoded]
    if jpegs:
        with warnings.catch_warnings():  # torchvision 0.29 points its decoders to torchcodec
            warnings.simplefilter("ignore", DeprecationWarning)
            jpegs = decode_jpeg(jpegs, mode=mode, device=device) if device.type == "cuda" else \
                [decode_jpeg(d, mode=mode) for d in jpegs]
    done = iter(jpegs)
    decoded_images = [next(done) if p.encoded else p.data.to(device, non_blocking=True) for p in items]
    out = []
    for x, p in zip(decoded_images, items):
        left, top, right, bottom = scaled(p.box, p.shown, tuple(x.shape[-2:]))
        y = F.resize(x[:, top:bottom, left:right], list(size), interpolation or InterpolationMode.BILINEAR,
                     antialias=True)
        out.append(y.flip(-1) if p.box.flip else y)
    batch = torch.stack(out)
    return normalise(batch) if normalise is not None else batch


def stack_images(good: list, bad: tuple[str, ...]) -> tuple[Any, torch.Tensor, tuple[str, ...]]:
    """(images, labels, skipped): images stacked, or for the GPU path (decode.Planned items) a
    list that `decode.decode_planned` turns into a batch on the device."""
    if not good:
        return torch.empty(0), torch.empty(0, dtype=torch.long), bad
    labels = torch.tensor([y for _, y in good], dtype=torch.long)
    images = [x for x, _ in good]
    if isinstance(images[0], Planned):
        return images, labels, bad
    if images[0].ndim == 3 and not images[0].is_contiguous() and all(x.permute(1, 2, 0).is_contiguous() for x in images):
        # channels-last images (the fast path's): stacked as (B, H, W, C) blocks, a plain copy,
        # and seen as (B, C, H, W) in channels-last layout
        return torch.stack([x.permute(1, 2, 0) for x in images]).permute(0, 3, 1, 2), labels, bad
    return torch.stack(images), labels, bad



def model_input(images: Any, device: Any, config: Any) -> torch.Tensor:
    """A loader's batch as the model's input on `device`, for a model of `config` (mean, std,
    image_size, in_channels, interpolation): planned images decoded there, uint8 moved there
    (a quarter of the bytes of floats) and normalised there, float batches moved."""
    normalise = Normalise(config.mean, config.std)
    if isinstance(images, list):
        return decode_planned(images, tuple(config.image_size), device, normalise,
                              _interpolation(config.interpolation), config.in_channels)
    return normalise(images.to(device, non_blocking=True))


# Builders, with the arguments of transforms.train_transform / eval_transform ------------
DECODERS = ("pil", "fast", "cuda")


def fast_train_transform(image_size: Any, mean: Sequence[float] = (0.5, 0.5, 0.5), std: Sequence[float] = (0.5, 0.5, 0.5),
                         in_channels: int = 3, interpolation: str = "bilinear", uint8: bool = False,
                         **augment: Any) -> FastTrainTransform:
    """`train_transform`'s augmentation, decoding only what the crop needs (uint8 out with uint8=True)."""
    return FastTrainTransform(_size(image_size), mean, std, in_channels, interpolation=_interpolation(interpolation),
                              uint8=uint8, **augment)


def training_transform(decode: str, image_size: Any, mean: Sequence[float] = (0.5, 0.5, 0.5),
                       std: Sequence[float] = (0.5, 0.5, 0.5), in_channels: int = 3, uint8: bool = False,
                       **augment: Any) -> Callable:
    """The training transform a `decode` setting names: "pil" transforms.train_transform (float
    out), "fast" FastTrainTransform, "cuda" PlanTransform (for decode_planned on the device)."""
    if decode not in DECODERS:
        raise ValueError(f"decode={decode!r}: use one of {', '.join(DECODERS)}")
    if decode == "cuda":
        if augment.get("randaugment"):
            raise ValueError("RandAugment runs on the CPU: use decode=fast (data.decode=fast) with randaugment")
        return PlanTransform(augment.get("crop_scale", CROP_SCALE), augment.get("crop_ratio", (3 / 4, 4 / 3)),
                             augment.get("hflip", True), in_channels)
    if decode == "fast":
        return fast_train_transform(image_size, mean, std, in_channels, uint8=uint8, **augment)
    return train_transform(image_size, mean, std, in_channels, **augment)


def fast_model_transform(config: Any) -> FastEvalTransform:
    """`transforms.model_transform(config)` for evaluation, fed at the reduced scale (opt-in)."""
    return fast_eval_transform(config.image_size, config.mean, config.std, config.in_channels, config.crop_fraction,
                               config.crop_mode, config.interpolation, backend=getattr(config, "resize_backend", "pil"))


def fast_eval_transform(image_size: Any, mean: Sequence[float] = (0.5, 0.5, 0.5), std: Sequence[float] = (0.5, 0.5, 0.5),
                        in_channels: int = 3, crop_fraction: float = 1.0, crop_mode: str = "squash",
                        interpolation: str = "bilinear", margin: int = 2, backend: str = "pil") -> FastEvalTransform:
    """`eval_transform`, fed by a JPEG decoded at the largest reduction that leaves `margin` times
    the size its resize makes (2: within 0.1 point of top-1 of the full decode, where 1 was not;
    benchmarks/results/decode-accuracy.md)."""
    inner = eval_transform(image_size, mean, std, in_channels, crop_fraction, crop_mode, interpolation, backend)
    size = _size(image_size)
    resize_to = (math.floor(size[0] / crop_fraction), math.floor(size[1] / crop_fraction))
    return FastEvalTransform(inner, resize_to, keep_ratio=crop_mode == "center", margin=margin)
