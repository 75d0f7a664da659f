"""The model side of `vitlab serve`: uploads in, class probabilities and attention maps out.

No web framework here. `Engine` holds one inference copy of the model (`vitlab.deploy`'s
copy for the precision) and the checkpoint's evaluation preprocessing; the batcher calls
`classify` / `look` with whole batches, always from one thread, so the copy is never run
twice at once.

Uploads are untrusted. `decode` reads only the header first (format and size) and refuses
anything that is not one of a few plain raster formats or that would decode to more than
`max_pixels`, so a decompression bomb is refused before a byte of it is decompressed.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from vitlab.analysis import attention_rollout
from vitlab.data import BadImageError, read_image
from vitlab.data.transforms import eval_transform, to_mode
from vitlab.deploy import Serving, for_precision
from vitlab.models.vit import VisionTransformer

# Plain raster formats only: PIL can also open formats that run other programs (EPS runs
# Ghostscript) or that few cameras write; an upload server has no use for those. (JPEG's
# opener also reads the MPO files of phone cameras.)
FORMATS = ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP", "PPM")
DISPLAY_SIDE = 384  # the longer side of the overlay image sent back


class UploadError(ValueError):
    """An upload the server refuses; `status` is the HTTP status that says why (4xx)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def decode(data: bytes, max_pixels: int) -> Image.Image:
    """A fully decoded PIL image, or UploadError (400 empty, 415 not an image, 422 too big or broken)."""
    if not data:
        raise UploadError(400, "the upload is empty: send the image file's bytes")
    Image.init()  # registers every plugin (WebP, TIFF, ...) so `formats` can name them; runs once
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as probe:  # parses the header only
            width, height, kind = probe.width, probe.height, probe.format
    except Image.DecompressionBombError as e:  # PIL's own last-resort limit, above ours
        raise UploadError(422, f"{e}; the server decodes at most {max_pixels:,} pixels (--max-pixels)") from None
    except UnidentifiedImageError:
        raise UploadError(415, f"not an image the server reads (it takes {', '.join(FORMATS)})") from None
    except Exception as e:  # a recognised format whose header is broken: PIL raises many types
        raise UploadError(422, f"the image header is damaged ({type(e).__name__}: {e})") from None
    if width < 1 or height < 1 or width * height > max_pixels:
        raise UploadError(
            422,
            f"the image is {width}x{height} pixels; the server decodes at most {max_pixels:,} pixels "
            "(--max-pixels): send a smaller image",
        )
    try:
        return read_image(io.BytesIO(data))
    except BadImageError as e:
        detail = str(e).split("cannot read this image ", 1)[-1].split("; fix or remove")[0]
        raise UploadError(422, f"the {kind} image cannot be decoded: it is damaged or truncated {detail}") from None


@dataclass
class Prepared:
    """One decoded upload: the model's input, and the picture to draw a map over."""

    tensor: Tensor  # (C, H, W), normalised as the checkpoint expects
    width: int
    height: int
    display: Optional[Image.Image] = None  # RGB, longer side DISPLAY_SIDE; only when asked


@dataclass
class Looked:
    """What the model saw in one image: its probabilities and where it attended."""

    probs: np.ndarray  # (num_classes,)
    rollout: np.ndarray  # (gh, gw), attention rollout scaled to max 1 (Fig. 6)
    heads: np.ndarray  # (layers, heads, gh, gw): each head's attention from the class token


class Engine:
    """One inference copy of a classifier, its preprocessing and its class names."""

    def __init__(self, model: VisionTransformer, precision: str = "fp32", checkpoint: str = "",
                 device: str | torch.device = "cpu"):
        cfg = model.config
        self.device = torch.device(device)
        if self.device.type != "cpu" and precision in ("fp32-packed", "int8"):
            raise ValueError(f"--precision {precision} is a CPU serving copy (oneDNN kernels); on {self.device} "
                             "serve fp32, bf16 or fp16")
        if not cfg.num_classes:
            raise ValueError("the model has no classification head (num_classes=0)")
        self.config = cfg
        self.precision = precision
        self.checkpoint = checkpoint
        self.parameters = sum(p.numel() for p in model.parameters())
        self.has_attention = cfg.has_attention  # a BiT ResNet classifies like a ViT, with nothing to map
        self.num_prefix = model.num_prefix_tokens if self.has_attention else 0
        names = list(getattr(model, "class_names", None) or [])
        self.class_names = names if len(names) == cfg.num_classes else [f"class {i}" for i in range(cfg.num_classes)]
        self.model = for_precision(model.eval().to(self.device), precision)
        self.transform = eval_transform(cfg.image_size, cfg.mean, cfg.std, cfg.in_channels)

    # Uploads -> tensors (any thread) -------------------------------------------------------
    def prepare(self, data: bytes, max_pixels: int, display: bool = False) -> Prepared:
        image = decode(data, max_pixels)
        shown = None
        if display:
            shown = to_mode(image, 3)
            scale = DISPLAY_SIDE / max(shown.size)
            shown = shown.resize(
                (max(1, round(shown.width * scale)), max(1, round(shown.height * scale))), Image.BILINEAR
            )
        return Prepared(self.transform(image), image.width, image.height, shown)

    # Batches (the batcher's one thread) --------------------------------------------------
    @torch.inference_mode()
    def classify(self, batch: list[Tensor]) -> list[np.ndarray]:
        """Softmax probabilities, one (num_classes,) array per image."""
        logits = self.model(torch.stack(batch).to(self.device))  # (B, classes)
        return list(logits.float().softmax(-1).cpu().numpy())

    @torch.inference_mode()
    def look(self, batch: list[Tensor]) -> list[Looked]:
        """Probabilities plus attention: the rollout and each head's map, per image."""
        x = torch.stack(batch).to(self.device)  # (B, C, H, W)
        inner, dtype = (
            (self.model.model, self.model.dtype) if isinstance(self.model, Serving) else (self.model, x.dtype)
        )
        out = inner(x.to(dtype), return_intermediates=True)
        attentions = [a.float().cpu() for a in out["attentions"]]  # per block, (B, heads, T, T)
        probs = out["logits"].float().softmax(-1).cpu().numpy()
        rollout = attention_rollout(attentions, out["grid"], self.num_prefix)  # (B, gh, gw)
        heads = self._head_maps(attentions, out["grid"])
        return [Looked(p, r, h) for p, r, h in zip(probs, rollout, heads)]

    def _head_maps(self, attentions: list[Tensor], grid: tuple[int, int]) -> np.ndarray:
        """(B, layers, heads, gh, gw): the class token's attention to each patch; without a
        class token (GAP), the mean over queries, which is what the pooled feature reads."""
        p = self.num_prefix
        rows = [a[:, :, 0, p:] if p else a.mean(dim=2) for a in attentions]  # each (B, heads, N)
        maps = torch.stack(rows, dim=1)  # (B, layers, heads, N)
        return maps.reshape(*maps.shape[:3], *grid).numpy()

    def warm_up(self, max_batch: int) -> None:
        """Run every path once (and the largest batch), so the first request pays no set-up."""
        x = torch.zeros(self.config.in_channels, *self.config.image_size)
        self.classify([x])
        self.classify([x] * max_batch)
        if self.has_attention:
            self.look([x])

    def describe(self) -> dict:
        cfg = self.config
        h, w = cfg.image_size
        return {
            "model": cfg.name,
            "checkpoint": self.checkpoint,
            "precision": self.precision,
            "parameters": self.parameters,
            "config": cfg.to_dict(),
            "classes": self.class_names,
            "preprocessing": {
                "resize": [h, w],
                "interpolation": "bilinear, antialiased; the whole image, no crop (the paper's evaluation)",
                "channels": "RGB" if cfg.in_channels == 3 else "L (greyscale)",
                "normalise": "(pixel / 255 - mean) / std",
                "mean": list(cfg.mean),
                "std": list(cfg.std),
                "modes": "greyscale, palette, 16-bit and transparent images are converted (transparency over white)",
            },
            "attention": ({"layers": cfg.depth, "heads": cfg.num_heads, "grid": list(cfg.grid_size)}
                          if self.has_attention else None),  # a BiT ResNet has none
        }
