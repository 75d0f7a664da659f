"""Decode only what the crop needs, and keep the pixels uint8 until the training process.

A JPEG is stored as 8x8 DCT blocks, and libjpeg can decode it at 1/2, 1/4 or 1/8 of its size
for a fraction of the work (PIL's `Image.draft`). When the crop is known before decoding --
the Inception crop's box is drawn from the image's size alone, the evaluation resize is a
function of it -- the image is decoded at the smallest of those scales at which the crop
still has at least the output's pixels, so the resize that follows still shrinks (or
keeps) and never enlarges what the full decode would have shrunk.

The training transform (augment.py) takes its decode as a step, one of `STEPS`: each opens
an image (encoded bytes, a PIL image or a uint8 tensor), has the box drawn on its shown size
(`draw_box`, the same draws as torchvision's RandomResizedCrop and RandomHorizontalFlip), and
returns the crop at the output size:

    pil    decoded in full by PIL, cropped and resized by PIL (torchvision's own path)
    fast   a JPEG decoded at the DCT scale the box needs, cropped, resized by torch's uint8
           antialiased kernel (a quarter of a float image through the workers)
    cuda   nothing decoded: the bytes and the box (`Planned`), decoded, cropped and resized
           on the GPU (`decode_planned`, torchvision.io.decode_jpeg(device="cuda"))

`FastEvalTransform` decodes at the reduced scale and then runs the evaluation transform
unchanged; its pixels differ from a full decode (by the mean absolute difference
`benchmarks/pipeline.py` reports), so it is opt-in: evaluation by default decodes in full, as
timm and Hugging Face do. Every image is opened through data/images.py (its checks, and one
decision of what is an image).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Callable, NamedTuple, Optional, Sequence, cast

import torch
from PIL import Image

from vitlab.data.datasets import Encoded
from vitlab.data.images import BadImageError, bad_image, check_size, decoded, image_bytes, jpeg_pixels, open_image, read_image, to_mode, to_uint8
from vitlab.pixels import normalise


def interpolation_mode(name: str) -> Any:
    """torchvision's InterpolationMode of a config's interpolation name."""
    from torchvision import transforms as T

    modes = {"bilinear": T.InterpolationMode.BILINEAR, "bicubic": T.InterpolationMode.BICUBIC,
             "nearest": T.InterpolationMode.NEAREST}
    if name not in modes:
        raise ValueError(f"interpolation {name!r}: use one of {', '.join(modes)}")
    return modes[name]


SCALES = (8, 4, 2, 1)
# EXIF orientations that turn the stored image a quarter: its width is the shown height.
TRANSPOSED = (5, 6, 7, 8)


def dct_scale(box: tuple[int, int], out: tuple[int, int], margin: int = 1) -> int:
    """The largest of 8, 4, 2, 1 that leaves a (h, w) crop box at least `margin` times the (h, w) output."""
    return next((s for s in SCALES if box[0] // s >= margin * out[0] and box[1] // s >= margin * out[1]), 1)


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
        im.load()  # PIL closes a file it opened itself once the pixels are read (open_image refused 0x0)
        return im
    except Exception as e:
        raise bad_image(name, e) from None


def decode_uint8(im: Image.Image, data: bytes, name: str, scale: int, in_channels: int) -> torch.Tensor:
    """uint8 (C, H, W) of an opened image at 1/scale, in the model's channels. A JPEG needing
    no reduction, no turn and no colour conversion goes to torchvision.io.decode_jpeg (the same
    libjpeg-turbo pixels, one copy fewer); everything else to PIL."""
    plain = (im.mode == "RGB" and in_channels == 3) or (im.mode == "L" and in_channels == 1)
    if scale == 1 and im.format == "JPEG" and plain and orientation(im) == 1:
        return jpeg_pixels(data, name, in_channels)
    try:
        return to_uint8(to_mode(decode_at(im, scale, name), in_channels))
    except BadImageError:
        if im.format != "JPEG":
            raise
        return jpeg_pixels(data, name, in_channels, upright=True)  # PIL refuses it: libjpeg's full decode


class Box(NamedTuple):
    """A crop (top, left, height, width) in the shown image's pixels, and the flip."""

    top: int
    left: int
    height: int
    width: int
    flip: bool


def draw_box(height: int, width: int, scale: Sequence[float], ratio: Sequence[float], hflip: bool) -> Box:
    """torchvision's RandomResizedCrop box, then RandomHorizontalFlip's coin, drawn from torch's
    global generator in that order: the same draws, and the same arithmetic (the log of the
    ratio range and each draw in float32), as `RandomResizedCrop.get_params`, without its
    per-call setup (tests/test_decode.py holds them equal)."""
    area = height * width
    log_lo, log_hi = _log_ratio(tuple(ratio))
    draw = torch.empty(1)
    for _ in range(10):
        target_area = area * draw.uniform_(scale[0], scale[1]).item()
        aspect_ratio = torch.exp(draw.uniform_(log_lo, log_hi)).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,)).item())
            j = int(torch.randint(0, width - w + 1, size=(1,)).item())
            break
    else:  # torchvision's fallback: the central crop at the nearest allowed ratio
        in_ratio = float(width) / float(height)
        if in_ratio < min(ratio):
            w, h = width, int(round(width / min(ratio)))
        elif in_ratio > max(ratio):
            h, w = height, int(round(height * max(ratio)))
        else:
            w, h = width, height
        i, j = (height - h) // 2, (width - w) // 2
    flip = bool(torch.rand(1) < 0.5) if hflip else False
    return Box(i, j, h, w, flip)


def whole_box(height: int, width: int, hflip: bool) -> Box:
    """The whole image as the box (data.crop=whole: resized to the output, whatever its aspect),
    then RandomHorizontalFlip's coin when `hflip`: no draw for the box."""
    return Box(0, 0, height, width, bool(torch.rand(1) < 0.5) if hflip else False)


@functools.lru_cache(maxsize=16)
def _log_ratio(ratio: tuple[float, float]) -> tuple[float, float]:
    """torch.log of the ratio range in float32, as torchvision computes it."""
    lo, hi = torch.log(torch.tensor(ratio))
    return float(lo), float(hi)


def scaled(box: Box, full: tuple[int, int], now: tuple[int, int]) -> tuple[int, int, int, int]:
    """The box (left, upper, right, lower) in an image decoded at (h, w) = `now` from `full`."""
    fy, fx = now[0] / full[0], now[1] / full[1]
    top, left = round(box.top * fy), round(box.left * fx)
    bottom = max(top + 1, min(now[0], round((box.top + box.height) * fy)))
    right = max(left + 1, min(now[1], round((box.left + box.width) * fx)))
    return left, top, right, bottom


# The decode steps of the training transform ----------------------------------------------
# Each takes (image, draw, size, interpolation, in_channels, antialias), where draw(height,
# width) -> Box draws the box on the shown size, and returns (the crop at `size`, the box).
# antialias (data.antialias): shrinking filters first (PIL's and torchvision's antialiased
# kernels), or samples the image as TF's tf.image.resize does by default (no filter).
def _opened(image: Encoded) -> tuple[bytes, Image.Image]:
    data = image_bytes(image.source, image.name)
    return data, open_image(data, image.name)


def pil_step(image: Any, draw: Callable, size: tuple[int, int], interpolation: Any, in_channels: int,
             antialias: bool = True) -> tuple[Any, Box]:
    """Decoded in full by PIL, cropped and resized by PIL: torchvision's RandomResizedCrop on
    the PIL image (a tensor, or any image without antialiasing, which PIL always does, is
    cropped and resized as torchvision does it for uint8 tensors)."""
    from torchvision.transforms import functional as F

    if isinstance(image, Encoded):
        image = read_image(image.source, image.name)
    elif isinstance(image, torch.Tensor) and image.dtype == torch.uint8:
        image = F.to_pil_image(image)
    if isinstance(image, Image.Image):
        image = to_mode(image, in_channels)
        image = image if antialias else to_uint8(image)
    h, w = (image.height, image.width) if isinstance(image, Image.Image) else tuple(image.shape[-2:])
    box = draw(h, w)
    return F.resized_crop(image, box.top, box.left, box.height, box.width, list(size), interpolation,
                          antialias=antialias), box


def fast_step(image: Any, draw: Callable, size: tuple[int, int], interpolation: Any, in_channels: int,
              antialias: bool = True) -> tuple[torch.Tensor, Box]:
    """A JPEG decoded at the DCT scale its box needs (a PNG, or a decoded image, in full), cut
    to the box and resized by torch's uint8 antialiased kernel: uint8 (C, H, W) at `size`."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    if isinstance(image, Encoded):  # without antialiasing, decoded in full: a reduced decode would filter
        x, full, box = _decode_for_box(image, draw, size if antialias else (1 << 30, 1 << 30), in_channels)
    else:
        if isinstance(image, Image.Image):
            image = to_uint8(to_mode(image, in_channels))
        full = (image.shape[-2], image.shape[-1])
        x, box = image, draw(*full)
    left, top, right, bottom = scaled(box, full, (x.shape[-2], x.shape[-1]))
    # the crop copied to one channels-last block: torch's uint8 kernel runs a third faster on it
    crop = x[None, :, top:bottom, left:right].contiguous(memory_format=torch.channels_last)
    if interpolation == InterpolationMode.BILINEAR and crop.dtype == torch.uint8:  # torch's native uint8 kernel
        return torch.nn.functional.interpolate(crop, size, mode="bilinear", align_corners=False, antialias=antialias)[0], box
    return F.resize(crop, list(size), interpolation, antialias=antialias)[0], box


def _decode_for_box(image: Encoded, draw: Callable, size: tuple[int, int], in_channels: int
                    ) -> tuple[torch.Tensor, tuple[int, int], Box]:
    """(uint8 pixels at the scale the box needs, the shown (h, w), the box drawn on it)."""
    data = image_bytes(image.source, image.name)
    header = jpeg_header(data)
    if header is not None and not header[3] and header[2] == in_channels and min(header[:2]) > 0:
        full = header[:2]  # no EXIF block, so no turn: the header's size is the shown size
        check_size(full[1], full[0], image.name)  # refused before decoding, as data/images.py does
        box = draw(*full)
        if dct_scale(box[2:4], size) == 1:
            x = jpeg_pixels(data, image.name, in_channels)
            if tuple(x.shape[-2:]) == full:
                return x, full, box
        im = open_image(data, image.name)
        return decode_uint8(im, data, image.name, dct_scale(box[2:4], size), in_channels), full, box
    im = open_image(data, image.name)
    full = shown_size(im)
    box = draw(*full)
    return decode_uint8(im, data, image.name, dct_scale(box[2:4], size), in_channels), full, box


class Planned(NamedTuple):
    """One training image for the device: its JPEG bytes (encoded=True) or, for what nvjpeg
    does not take (other formats, CMYK, an EXIF rotation, images held in memory), its pixels
    decoded on the CPU, uint8 (C, H, W); and the box and flip drawn for it."""

    data: torch.Tensor
    box: Box
    shown: tuple[int, int]
    encoded: bool
    name: str = ""
    antialias: bool = True


def cuda_step(image: Any, draw: Callable, size: tuple[int, int], interpolation: Any, in_channels: int,
              antialias: bool = True) -> tuple[Planned, Box]:
    """For data.decode=cuda: a JPEG's header read and its box drawn as the CPU steps draw it
    (the same draws for the same seed); the decoding left to the device (`decode_planned`)."""
    if isinstance(image, Encoded):
        data, im = _opened(image)
        full = shown_size(im)
        if im.format == "JPEG" and im.mode in ("RGB", "L") and full == (im.height, im.width):
            box = draw(*full)
            return Planned(torch.frombuffer(bytearray(data), dtype=torch.uint8), box, full, True, image.name,
                           antialias), box
        image = decode_uint8(im, data, image.name, 1, in_channels)  # decoded on the CPU, cropped on the device
    pixels = to_uint8(to_mode(image, in_channels)) if isinstance(image, Image.Image) else image
    full = tuple(pixels.shape[-2:])
    box = draw(*full)
    return Planned(pixels, box, full, False, antialias=antialias), box


STEPS = {"pil": pil_step, "fast": fast_step, "cuda": cuda_step}  # data.decode: how training images are decoded


class FastEvalTransform:
    """An evaluation transform (a torchvision Compose from `eval_transform`) fed by an image
    decoded at the largest DCT reduction that still leaves `margin` times what its resize makes
    (`resize_to`, h, w: the size before its crop, or its output). Opt-in: the pixels differ from
    a full decode by a little (see the module docstring)."""

    takes_encoded = True

    def __init__(self, transform: Callable, resize_to: tuple[int, int], keep_ratio: bool, margin: int = 2):
        self.transform, self.resize_to, self.keep_ratio = transform, cast(tuple[int, int], tuple(resize_to)), keep_ratio
        self.margin = margin

    def needed(self, full: tuple[int, int]) -> tuple[int, int]:
        """The (h, w) the resize makes of a shown (h, w) image."""
        if not self.keep_ratio:
            return self.resize_to
        r = max(self.resize_to[0] / full[0], self.resize_to[1] / full[1])
        return (round(full[0] * r), round(full[1] * r))

    def __call__(self, image: Any) -> torch.Tensor:
        if isinstance(image, Encoded):
            _, im = _opened(image)
            full = shown_size(im)
            image = decode_at(im, dct_scale(full, self.needed(full), self.margin), image.name)
        return self.transform(image)


def decode_planned(items: Sequence[Planned], size: tuple[int, int], device: Any,
                   mean_std: Optional[tuple[Sequence[float], Sequence[float]]] = None, interpolation: Any = None,
                   in_channels: int = 3) -> torch.Tensor:
    """Decode, crop, resize and flip a batch of planned images on `device` (CUDA: nvjpeg through
    torchvision.io.decode_jpeg; the CPU runs the same operations, which is how it is tested).
    Returns uint8 (B, C, H, W), or the batch normalised with `mean_std` (vitlab.pixels)."""
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    mode = ImageReadMode.RGB if in_channels == 3 else ImageReadMode.GRAY
    device = torch.device(device)
    jpegs = [p.data for p in items if p.encoded]
    if jpegs:
        try:
            with warnings.catch_warnings():  # torchvision 0.29 points its decoders to torchcodec
                warnings.simplefilter("ignore", DeprecationWarning)
                jpegs = decode_jpeg(jpegs, mode=mode, device=device) if device.type == "cuda" else \
                    [decode_jpeg(d, mode=mode) for d in jpegs]
        except RuntimeError:  # one the device's decoder refuses: each on the CPU, as data/images.py decides
            jpegs = [jpeg_pixels(p.data.numpy().tobytes(), p.name, in_channels).to(device) for p in items if p.encoded]
    done = iter(jpegs)
    decoded_images = [next(done) if p.encoded else p.data.to(device, non_blocking=True) for p in items]
    out = []
    for x, p in zip(decoded_images, items, strict=True):
        left, top, right, bottom = scaled(p.box, p.shown, (x.shape[-2], x.shape[-1]))
        y = F.resize(x[:, top:bottom, left:right], list(size), interpolation or InterpolationMode.BILINEAR,
                     antialias=p.antialias)
        out.append(y.flip(-1) if p.box.flip else y)
    batch = torch.stack(out)
    return normalise(batch, *mean_std) if mean_std is not None else batch


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
    (a quarter of the bytes of floats) and normalised there (vitlab.pixels), float batches
    (normalised by their transform) moved."""
    if isinstance(images, list):
        return decode_planned(images, tuple(config.image_size), device, (config.mean, config.std),
                              interpolation_mode(config.interpolation), config.in_channels)
    images = images.to(device, non_blocking=True)
    return normalise(images, config.mean, config.std) if images.dtype == torch.uint8 else images
