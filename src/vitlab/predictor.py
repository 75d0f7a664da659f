"""One way to classify images with a checkpoint: `vitlab.Predictor`, used by `vitlab predict`,
`vitlab serve` and Python alike.

    predictor = vitlab.Predictor.load("runs/cifar10/checkpoints/last.safetensors")
    for row in predictor.predict(["cat.png", "ship.jpg"], top_k=3, attention=True):
        print(row["image"], row["predictions"][0])     # {"class", "index", "probability"}

A Predictor holds one inference copy of a classifier in the chosen precision (on a CPU
`vitlab.deploy.inference_copy`: fp32 on the kernels timed fastest on this machine by default, or bf16, fp16, int8, or with
`plain=True` the model as it is; on a GPU fp32, or bf16/fp16 as autocast), its
preprocessing (`model_transform`: the checkpoint's crop, resize and backend, the same function
every command uses) and its class names. It batches, returns softmax probabilities, the top k,
and with `attention` the rollout (Fig. 6) and each head's map from the class token, and draws
the rollout over the image with the one overlay renderer (`analysis.overlay`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence, cast

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vitlab import checkpoints, suggest
from vitlab.analysis import attention_rollout
from vitlab.analysis.overlay import captioned, overlay
from vitlab.config import ConfigError
from vitlab.data import read_image
from vitlab.data.transforms import EvalTransform, image_input, model_transform, to_mode
from vitlab.deploy import PRECISIONS, Serving, inference_copy
from vitlab.files import OutputFolder, atomic_write, to_name
from vitlab.models import Model, VisionTransformer

DISPLAY_SIDE = 384  # the longer side of an overlay image


@dataclass
class Looked:
    """What the model saw in one image: its probabilities and, with attention, where it looked."""

    probs: np.ndarray  # (num_classes,)
    rollout: Optional[np.ndarray] = None  # (gh, gw), attention rollout scaled to max 1 (Fig. 6)
    heads: Optional[np.ndarray] = None  # (layers, heads, gh, gw): each head's attention from the class token


def overlay_name(number: int, stem: str) -> str:
    """The overlay PNG of the number-th image, from its file's stem made one safe, short name
    (files.to_name): a stem of any length or characters stays one file in the folder."""
    return to_name(f"{number:04d}_{stem}_rollout", 100) + ".png"


def check_precision(precision: str) -> None:
    """A precision of PRECISIONS, else one line with the near one (checked before any reading)."""
    if precision not in PRECISIONS:
        raise ConfigError(suggest.unknown("precision", precision, PRECISIONS))


class Predictor:
    """A classifier ready for images: preprocessing, precision, batching, top-k, attention."""

    def __init__(self, model: Model, precision: str = "fp32", device: str | torch.device | None = None,
                 checkpoint: str = "", plain: bool = False):
        cfg = model.config
        if not cfg.num_classes:
            raise ConfigError(f"{checkpoint or cfg.name}: the model has no classification head (num_classes=0); "
                              "fine-tune it (`vitlab finetune`) or evaluate its features with `vitlab linear-probe`")
        check_precision(precision)
        self.device = torch.device(device or "cpu")
        if self.device.type != "cpu" and precision not in ("fp32", "bf16", "fp16"):
            raise ConfigError(f"precision {precision!r} is a CPU serving copy; on {self.device} use fp32, bf16 or fp16")
        self.config, self.precision, self.checkpoint = cfg, precision, checkpoint
        self.parameters = sum(p.numel() for p in model.parameters())
        self.has_attention = cfg.has_attention  # a BiT ResNet classifies like a ViT, with nothing to map
        self.num_prefix = model.num_prefix_tokens if isinstance(model, VisionTransformer) else 0  # (has_attention)
        names = list(getattr(model, "class_names", None) or [])
        self.class_names = names if len(names) == cfg.num_classes else [f"class {i}" for i in range(cfg.num_classes)]
        self.transform = cast(EvalTransform, model_transform(cfg))  # (train=False: an EvalTransform) the checkpoint's crop, resize and backend, as every command
        model = model.eval()
        on_cpu = self.device.type == "cpu"
        self.model = inference_copy(model, precision, plain=plain) if on_cpu else model.to(self.device)
        self.autocast = None if on_cpu or precision == "fp32" else (torch.bfloat16 if precision == "bf16" else torch.float16)

    @classmethod
    def load(cls, checkpoint: str | os.PathLike, format: Optional[str] = None, precision: str = "fp32",
             device: str | torch.device | None = None, plain: bool = False, **overrides: Any) -> "Predictor":
        """A Predictor for a checkpoint path or name (anything `vitlab.load` reads)."""
        model = checkpoints.load(checkpoint, format, **overrides)
        return cls(model, precision, device, checkpoint=str(checkpoint), plain=plain)

    # Images -> tensors ---------------------------------------------------------------------
    def preprocess(self, image: Image.Image | Tensor | np.ndarray | str | os.PathLike) -> Tensor:
        """One image (a file, a PIL image, a numpy (H, W, C) array or a (C, H, W) tensor; see
        data.transforms.image_input, which refuses anything else and NaN pixels) as the model's input."""
        if isinstance(image, (str, os.PathLike)):
            image = read_image(image)
        return self.transform(image)

    @staticmethod
    def _batch(batch: Sequence[Tensor] | Tensor) -> Tensor:
        """Prepared images as one tensor; one that holds NaN or infinity is refused by number
        (it would give NaN probabilities and a meaningless top class)."""
        x = batch if isinstance(batch, Tensor) else torch.stack(list(batch))
        if x.is_floating_point():
            finite = torch.isfinite(x.flatten(1)).all(dim=1)
            if not bool(finite.all()):
                bad = int((~finite).nonzero()[0])
                raise ValueError(f"image {bad} of the batch holds NaN or infinite values; pass finite pixels")
        return x

    def display(self, image: Image.Image) -> Image.Image:
        """The picture a map is drawn over: RGB, its longer side DISPLAY_SIDE."""
        shown = to_mode(image, 3)
        scale = DISPLAY_SIDE / max(shown.size)
        return shown.resize((max(1, round(shown.width * scale)), max(1, round(shown.height * scale))), Image.Resampling.BILINEAR)

    # Batches -> answers --------------------------------------------------------------------
    def _forward(self, x: Tensor, intermediates: bool):
        inner, x = self.model, x.to(self.device)
        if intermediates and isinstance(self.model, Serving):  # an inference copy: cast in, the inner model for attention
            inner, x = self.model.model, x.to(self.model.dtype)
        with torch.autocast(self.device.type, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            return inner(x, return_intermediates=True) if intermediates else inner(x)

    @torch.inference_mode()
    def classify(self, batch: Sequence[Tensor] | Tensor) -> list[np.ndarray]:
        """Softmax probabilities, one (num_classes,) array per prepared image."""
        x = self._batch(batch)
        return list(self._forward(x, False).float().softmax(-1).cpu().numpy())

    @torch.inference_mode()
    def look(self, batch: Sequence[Tensor] | Tensor) -> list[Looked]:
        """Probabilities plus attention: the rollout and each head's map, per image."""
        if not self.has_attention:
            raise ConfigError(f"{self.config.name} is a BiT ResNet and has no attention to draw")
        x = self._batch(batch)
        out = self._forward(x, True)
        attentions = [a.float().cpu() for a in out["attentions"]]  # per block, (B, heads, T, T)
        probs = out["logits"].float().softmax(-1).cpu().numpy()
        rollout = attention_rollout(attentions, out["grid"], self.num_prefix)  # (B, gh, gw)
        heads = self._head_maps(attentions, out["grid"])
        return [Looked(p, r, h) for p, r, h in zip(probs, rollout, heads, strict=True)]

    def _head_maps(self, attentions: list[Tensor], grid: tuple[int, int]) -> np.ndarray:
        """(B, layers, heads, gh, gw): the class token's attention to each patch; without a
        class token (GAP), the mean over queries, which is what the pooled feature reads."""
        p = self.num_prefix
        rows = [a[:, :, 0, p:] if p else a.mean(dim=2) for a in attentions]  # each (B, heads, N)
        maps = torch.stack(rows, dim=1)  # (B, layers, heads, N)
        return maps.reshape(*maps.shape[:3], *grid).numpy()

    def top_k(self, probs: np.ndarray, k: int) -> list[dict[str, Any]]:
        """The k most probable classes: [{"class", "index", "probability"}], most probable first."""
        order = np.argsort(-probs, kind="stable")[: min(k, len(probs))]
        return [{"class": self.class_names[i], "index": int(i), "probability": float(probs[i])} for i in order]

    # Files -> rows -------------------------------------------------------------------------
    def predict(self, images: Iterable[Any], top_k: int = 5, batch_size: int = 16, attention: bool = False,
                overlays: Optional[str | os.PathLike | OutputFolder] = None, on_error=None) -> Iterator[dict[str, Any]]:
        """Rows {"image", "predictions", ["rollout", "attention"]} for images (files, PIL images,
        numpy arrays or tensors), batch_size at a time, each batch's rows as soon as it is done. With
        `overlays` (a folder) the rollout over each image is written there as a PNG
        (`attention`: its path). A file that cannot be read goes to `on_error(image, error)`
        and is skipped (without on_error, the error is raised)."""
        if top_k < 1 or batch_size < 1:
            raise ConfigError(f"top_k and batch_size must be at least 1, got {top_k} and {batch_size}")
        chunk: list[tuple[Any, Tensor, Optional[Image.Image]]] = []
        written = 0
        for item in images:
            try:
                picture = read_image(item) if isinstance(item, (str, os.PathLike)) else image_input(item)
                chunk.append((item, self.preprocess(picture), picture if overlays is not None else None))
            except Exception as e:  # PIL raises many types for a file that is not an image
                if on_error is None:
                    raise
                on_error(item, e)
            if len(chunk) == batch_size:
                yield from self._rows(chunk, top_k, attention or overlays is not None, overlays, written)
                written, chunk = written + len(chunk), []
        if chunk:
            yield from self._rows(chunk, top_k, attention or overlays is not None, overlays, written)

    def _rows(self, chunk, top_k: int, attention: bool, overlays, offset: int) -> list[dict[str, Any]]:
        x = torch.stack([t for _, t, _ in chunk])
        looked = self.look(x) if attention else [Looked(p) for p in self.classify(x)]
        rows = []
        for i, ((item, _, picture), seen) in enumerate(zip(chunk, looked, strict=True)):
            row: dict[str, Any] = {"image": str(item) if isinstance(item, (str, os.PathLike)) else offset + i,
                                   "predictions": self.top_k(seen.probs, top_k), "probabilities": seen.probs}
            if seen.rollout is not None:
                row["rollout"] = seen.rollout
            if overlays is not None and picture is not None:
                folder = overlays if isinstance(overlays, OutputFolder) else Path(overlays)
                row["attention"] = str(self.write_overlay(picture, seen, row, folder, offset + i))
            rows.append(row)
        return rows

    def overlay(self, image: Image.Image, rollout: np.ndarray) -> Image.Image:
        """The rollout as a heat map over the image (the display size), the one renderer."""
        return overlay(self.display(image), rollout)

    def write_overlay(self, image: Image.Image, seen: Looked, row: dict, folder: Path | OutputFolder, number: int) -> Path:
        """NNNN_STEM_rollout.png in `folder`: the overlay, captioned with the top class. In an
        OutputFolder (predict --attention) a user's file of that name is refused, not replaced."""
        assert seen.rollout is not None, "write_overlay draws what look() returned"
        top = row["predictions"][0]
        stem = Path(row["image"]).stem if isinstance(row["image"], str) else "image"
        picture = captioned(self.overlay(image, seen.rollout), f"{top['class']} ({100 * top['probability']:.1f}%)")
        if isinstance(folder, OutputFolder):
            target = folder.path(overlay_name(number, stem))
        else:
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / overlay_name(number, stem)
        atomic_write(target, lambda tmp: picture.save(tmp, format="PNG"))
        return target
