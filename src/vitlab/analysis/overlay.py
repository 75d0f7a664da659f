"""Attention drawn over the image as a heat map: vitlab's one overlay renderer, with its one
colour map. `vitlab predict --attention` writes its PNGs with it, `/predict?attention=true`
returns them, and the figures of `vitlab inspect` (plots.py) colour their heat maps from the
same table.

Drawn with PIL and numpy alone (the server does not need matplotlib). The colour scale runs
from near-black (no attention) through purple and red to pale yellow (the most), close to
matplotlib's "inferno": perceptually ordered, and readable in greyscale. The page at `/`
draws its heat maps and colour bar from the same stops (`COLOR_STOPS`, sent in `/info`).
"""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from vitlab.analysis.rollout import upsample_map

# (position in [0, 1], (r, g, b)); linear in between.
COLOR_STOPS = (
    (0.0, (0, 0, 4)),
    (0.25, (66, 10, 104)),
    (0.5, (147, 38, 103)),
    (0.75, (221, 81, 58)),
    (0.9, (248, 160, 30)),
    (1.0, (252, 255, 164)),
)


def color_table(stops=COLOR_STOPS) -> np.ndarray:
    """(256, 3) uint8: the colour of each level 0..255."""
    at = np.array([s[0] for s in stops])
    rgb = np.array([s[1] for s in stops], dtype=np.float64)
    levels = np.linspace(0.0, 1.0, 256)
    return np.stack([np.interp(levels, at, rgb[:, c]) for c in range(3)], axis=1).round().astype(np.uint8)


_TABLE = color_table()


def heat_map(grid: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(gh, gw) map -> (H, W, 3) uint8 colours, bilinearly upsampled, scaled to its maximum."""
    up = upsample_map(np.asarray(grid, dtype=np.float32)[None], size)[0]  # (H, W)
    up = np.clip(up / max(float(up.max()), 1e-12), 0.0, 1.0)
    return _TABLE[np.round(up * 255).astype(np.uint8)]


def overlay(image: Image.Image, grid: np.ndarray, alpha: float = 0.55) -> Image.Image:
    """The RGB image with the map's colours blended over it (alpha = the map's weight)."""
    heat = Image.fromarray(heat_map(grid, (image.height, image.width)), "RGB")
    return Image.blend(image.convert("RGB"), heat, alpha)


def overlay_png_base64(image: Image.Image, grid: np.ndarray) -> str:
    buf = io.BytesIO()
    overlay(image, grid).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def colormap():
    """The same colours as a matplotlib colormap, for the figures that matplotlib draws."""
    from matplotlib.colors import ListedColormap

    return ListedColormap(_TABLE / 255.0, name="vitlab-attention")


def captioned(image: Image.Image, caption: str) -> Image.Image:
    """`image` with a line of text in a strip under it (PIL's own font: no font files needed)."""
    from PIL import ImageDraw

    strip = 16
    out = Image.new("RGB", (image.width, image.height + strip), (255, 255, 255))
    out.paste(image.convert("RGB"), (0, 0))
    ImageDraw.Draw(out).text((4, image.height + 2), caption, fill=(0, 0, 0))
    return out
