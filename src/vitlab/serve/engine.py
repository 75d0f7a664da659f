"""The model side of `vitlab serve`: uploads in, class probabilities and attention maps out.

No web framework here. `Engine` is a `vitlab.Predictor` (the library's one inference path:
the precision copy, the checkpoint's preprocessing, class names, probabilities, attention)
with the server's upload decoding; the batcher calls `classify` / `look` with whole
batches, always from one thread, so the copy is never run twice at once.

Uploads are untrusted. `decode` reads only the header first (format and size) and refuses
anything that is not one of a few plain raster formats or that would decode to more than
`max_pixels`, so a decompression bomb is refused before a byte of it is decompressed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from PIL import Image
from torch import Tensor

from vitlab.config import ViTConfig
from vitlab.data import BadImageError, read_image
from vitlab.data.images import FORMATS, open_image
from vitlab.models import Model
from vitlab.predictor import DISPLAY_SIDE, Looked, Predictor  # noqa: F401  (Looked: what look returns)


class UploadError(ValueError):
    """An upload the server refuses; `status` is the HTTP status that says why (4xx)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def decode(data: bytes, max_pixels: int) -> Image.Image:
    """A fully decoded PIL image, or UploadError (400 empty, 415 not an image, 422 too big or
    broken). data/images.py opens it, as it opens every image vitlab reads: the header only
    first, then the format and the size (at most `max_pixels`) checked before decoding."""
    if not data:
        raise UploadError(400, "the upload is empty: send the image file's bytes")
    try:
        probe = open_image(data, "the upload", max_pixels)  # parses the header only
    except BadImageError as e:
        if e.reason == "unknown-format":
            raise UploadError(415, f"not an image the server reads (it takes {', '.join(FORMATS)})") from None
        if e.reason == "too-big":
            raise UploadError(422, f"{e.detail}; the server decodes at most {max_pixels:,} pixels (--max-pixels)") from None
        raise UploadError(422, f"the image header is damaged ({e.detail})") from None
    try:
        return read_image(data, "the upload", max_pixels)
    except BadImageError as e:
        raise UploadError(422, f"the {probe.format} image cannot be decoded: it is damaged or truncated "
                          f"({e.detail})") from None


@dataclass
class Prepared:
    """One decoded upload: the model's input, and the picture to draw a map over."""

    tensor: Tensor  # (C, H, W), normalised as the checkpoint expects
    width: int
    height: int
    display: Optional[Image.Image] = None  # RGB, longer side DISPLAY_SIDE; only when asked


class Engine(Predictor):
    """vitlab.Predictor behind the server: the same inference copy, preprocessing, class
    names, probabilities and attention, plus bounded decoding of uploads, warm-up and /info."""

    def __init__(self, model: Model, precision: str = "fp32", checkpoint: str = "",
                 device: str | torch.device = "cpu", plain: bool = False):
        super().__init__(model, precision, device, checkpoint, plain)  # `vitlab serve --device`, `--plain`

    # Uploads -> tensors (any thread) -------------------------------------------------------
    def prepare(self, data: bytes, max_pixels: int, display: bool = False) -> Prepared:
        image = decode(data, max_pixels)
        return Prepared(self.transform(image), image.width, image.height, self.display(image) if display else None)

    # Batches (the batcher's one thread): Predictor.classify and Predictor.look ------------
    def warm_up(self, max_batch: int) -> None:
        """Run every path once (and the largest batch), so the first request pays no set-up."""
        x = torch.zeros(self.config.in_channels, *self.config.image_size)
        self.classify([x])
        self.classify([x] * max_batch)
        if self.has_attention:
            self.look([x])

    @property
    def short_name(self) -> str:
        """The model's name in every answer: a reshaped variant as "ViT-Ti/4 (custom)", its
        sizes left to /info (they repeated in every answer, longer than the answer itself)."""
        name = self.config.name
        return name.split(" (custom:")[0] + " (custom)" if " (custom:" in name else name

    def describe(self) -> dict:
        cfg = self.config
        h, w = cfg.image_size
        return {
            "model": cfg.name, "checkpoint": self.checkpoint, "precision": self.precision, "parameters": self.parameters,
            "config": cfg.to_dict(), "classes": self.class_names,
            "preprocessing": {"resize": list(self.transform.resize_size), "crop": list(cfg.image_size) if self.transform.crops else None,
                              "crop_fraction": cfg.crop_fraction, "crop_mode": cfg.crop_mode, "interpolation": f"{cfg.interpolation}, antialiased",
                              "resize_backend": cfg.resize_backend, "channels": "RGB" if cfg.in_channels == 3 else "L (greyscale)",
                              "normalise": "(pixel / 255 - mean) / std", "mean": list(cfg.mean), "std": list(cfg.std),
                              "modes": "greyscale, palette, 16-bit and transparent images are converted (transparency over white)",
                              "summary": repr(self.transform)},
            "attention": ({"layers": cfg.depth, "heads": cfg.num_heads, "grid": list(cfg.grid_size)}
                          if isinstance(cfg, ViTConfig) else None),  # (has_attention)  # a BiT ResNet has none
        }
