"""Opening an image, in one place: what counts as an image, and the checks every reader makes.

Every image vitlab reads (a file of an image folder, a WebDataset or tfds record, a Hugging
Face row, an upload to `vitlab serve`, a file given to predict, eval or inspect) comes
through here:

- `image_bytes(source)`: the encoded bytes of a path (a regular file only: a FIFO would block
  the reader forever), bytes, or a file object;
- `open_image(data, name)`: opened, not decoded: one of a few plain raster formats (PIL can
  also open formats that run other programs, such as EPS through Ghostscript), and its size,
  read from the header, within the pixel limit (PIL's decompression-bomb limit,
  `Image.MAX_IMAGE_PIXELS`, or a smaller one such as `vitlab serve --max-pixels`): a bomb is
  refused before a byte of its pixels is decompressed;
- `read_image(source)`: decoded in full, upright by its EXIF orientation, palettes expanded;
- `jpeg_pixels(data, name, channels)`: a JPEG as uint8 (C, H, W) through libjpeg-turbo
  (torchvision.io), what the fast training path and the GPU path decode with.

Which files are images is decided here once, for both decoders: a JPEG one of them refuses
and the other reads (arithmetic coding, which some libjpeg builds leave out) is read by the
other, whichever path asked, so training and evaluation never disagree on a file. A file
neither reads is one BadImageError naming it.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any, BinaryIO, Optional, Union

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from vitlab.files import NotRegularFileError, require_regular_file

# Plain raster formats only. (JPEG's opener also reads the MPO files of phone cameras.)
FORMATS = ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP", "PPM")
Source = Union[str, os.PathLike, bytes, bytearray, memoryview, BinaryIO]


class BadImageError(ValueError):
    """An image file that cannot be decoded; the message names the file. `reason` says why as
    data, one of REASONS (what a server turns into an HTTP status), and `detail` what the
    decoder found, without the message's advice to a training run."""

    def __init__(self, message: str, reason: str = "damaged", detail: str = ""):
        super().__init__(message)
        self.reason = reason
        self.detail = detail or message

    def __reduce__(self):  # raised in a data-loader worker, it crosses to the parent whole
        return (type(self), (str(self), self.reason, self.detail))


# Why an image is refused: a format no decoder here reads, no pixels, more pixels than the limit,
# not a regular file, or broken (a damaged header or truncated data).
REASONS = ("unknown-format", "no-pixels", "too-big", "not-a-file", "damaged")


def bad_image(name: Any, e: Exception, reason: Optional[str] = None) -> BadImageError:
    """The one-line refusal of an image that cannot be decoded."""
    if reason is None:
        reason = ("unknown-format" if isinstance(e, UnidentifiedImageError)
                  else "too-big" if isinstance(e, Image.DecompressionBombError) else "damaged")
    detail = f"{type(e).__name__}: {e}"
    return BadImageError(f"{name}: cannot read this image ({detail}); "
                         "fix or remove the file, or pass --skip-bad-images to skip and count such files", reason, detail)


def image_bytes(source: Source, name: Any = None) -> bytes:
    """The encoded bytes of a path (a regular file), of bytes, or of a file object."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        try:
            require_regular_file(source, "image file")
        except NotRegularFileError as e:
            raise bad_image(name or source, ValueError(f"it is {e.kind}, not a regular file"), "not-a-file") from None
        return Path(source).read_bytes()
    return source.read()


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


def check_size(width: int, height: int, name: Any, max_pixels: Optional[int] = None) -> None:
    """Refuse an image of no pixels, or of more than the limit (PIL's decompression-bomb limit)."""
    limit = max_pixels or Image.MAX_IMAGE_PIXELS
    if width < 1 or height < 1:
        raise bad_image(name, ValueError(f"the image is {width}x{height} pixels"), "no-pixels")
    if limit is not None and width * height > limit:  # (Image.MAX_IMAGE_PIXELS = None turns PIL's limit off)
        raise bad_image(name, ValueError(f"{width}x{height} pixels, over the limit of {limit:,} pixels "
                                         "(a decompression bomb, or an image to shrink first)"), "too-big")


def open_image(data: bytes, name: Any, max_pixels: Optional[int] = None) -> Image.Image:
    """The image opened from its header (not decoded), its format and size checked."""
    Image.init()  # registers every plugin (WebP, TIFF, ...) so that FORMATS can name them; runs once
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the limit is check_size's
            im = Image.open(io.BytesIO(data), formats=FORMATS)
    except Exception as e:  # PIL raises many types for broken files
        raise bad_image(name, e) from None
    check_size(im.width, im.height, name, max_pixels)
    return im


def decoded(im: Image.Image) -> Image.Image:
    """A fully decoded copy of an open image: upright by its EXIF orientation, palettes expanded."""
    im.load()
    if im.width < 1 or im.height < 1:
        raise ValueError(f"the image is {im.width}x{im.height} pixels")
    try:
        im = ImageOps.exif_transpose(im)  # always a copy (in_place=False)
    except Exception:  # a broken EXIF block: the pixels are still good
        im = im.copy()
    if im.mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    return im


def read_image(source: Source, name: Any = None, max_pixels: Optional[int] = None) -> Image.Image:
    """Open and fully decode an image (a path, bytes, or a file object such as an upload), or
    raise BadImageError naming it. The EXIF orientation of a photo is applied, as every viewer
    does, so a portrait shot from a phone is upright."""
    name = name or (source if isinstance(source, (str, os.PathLike)) else "the image")
    data = image_bytes(source, name)  # FileNotFoundError stays itself: a missing file is not a bad image
    im = open_image(data, name, max_pixels)
    try:
        return decoded(im)
    except Exception as e:
        if im.format != "JPEG":
            raise bad_image(name, e) from None
        pixels = _libjpeg(data, 3, exif=True)  # the other decoder: one opener decides for both paths
        if pixels is None:
            raise bad_image(name, e) from None
        a = pixels.permute(1, 2, 0).numpy()
        return Image.fromarray(a[..., 0] if a.shape[-1] == 1 else np.ascontiguousarray(a))


def _libjpeg(data: bytes, channels: Optional[int], exif: bool = False) -> Optional[torch.Tensor]:
    """torchvision.io.decode_jpeg of the bytes as uint8 (C, H, W), or None when it cannot (no
    torchvision decoder, or it refuses the file)."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:  # torchvision's decoders are deprecated for torchcodec and may go
        return None
    mode = {3: ImageReadMode.RGB, 1: ImageReadMode.GRAY}.get(channels or 0, ImageReadMode.UNCHANGED)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=mode,
                               apply_exif_orientation=exif)
    except RuntimeError:
        return None


def jpeg_pixels(data: bytes, name: Any, channels: int, upright: bool = False) -> torch.Tensor:
    """A JPEG's pixels as uint8 (C, H, W) in 1 or 3 channels, by libjpeg-turbo (torchvision),
    or by PIL where that refuses the file; BadImageError where neither reads it. `upright`:
    turned by its EXIF orientation (PIL's pixels always are)."""
    pixels = _libjpeg(data, channels, exif=upright)
    if pixels is not None:
        return pixels
    try:
        image = to_mode(decoded(open_image(data, name)), channels)
    except Exception as e:
        raise bad_image(name, e) from None
    return to_uint8(image).contiguous()


def to_uint8(image: Image.Image) -> torch.Tensor:
    """An L or RGB PIL image as a uint8 (C, H, W) tensor (one copy; an RGB one is a
    channels-last view)."""
    a = torch.from_numpy(np.array(image))
    return a[None] if a.ndim == 2 else a.permute(2, 0, 1)
