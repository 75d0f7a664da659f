"""Fig. 7 (right) and App. D.7: mean attention distance, per layer and head.

For a query patch, the attention-weighted average of the image-space distance (in pixels)
to the patches it attends to; averaged over all query patches and
over images (the paper uses 128). Analogous to receptive-field size in a CNN: the paper
finds some heads attend globally already in the lowest layers, and distance grows with depth.

The class token has no place in the image, so it is left out on both sides: its own row
(the class token as a query) is dropped, and its column (patches attending to the class
token) is dropped and each remaining row renormalised to sum to 1. The distance is thus
"how far away are the patches this query reads, given it reads patches". The attention
mass that went to the class token is returned separately so nothing is hidden.

Two definitions of the distance between a query patch and a key patch (`mode`):
- "centres" (the default): between the two patch centres;
- "pixels": the mean distance between a pixel of the query patch and a pixel of the key
  patch, over all pairs: the paper's "distance in image space" (App. D.7) with a patch's
  attention spread evenly over its pixels. A patch attending to itself is then s·0.52 px
  away rather than 0 (s the patch size in pixels); between far patches the two agree.
`uniform_distance` is the value of uniform attention over the patches, the reference a
trained head is read against (a random-init model sits near it too).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

MODES = ("centres", "pixels")


def _pixel_pair_mean(dy: Tensor, dx: Tensor, s: int) -> Tensor:
    """Mean distance between the pixels of two s x s patches whose corners are (dy, dx)
    pixels apart: pixel offsets e within a pair occur (s - |e|) times in each axis."""
    e = torch.arange(-(s - 1), s, dtype=torch.float64)
    w = (s - e.abs()) / s**2  # the share of pixel pairs with offset e along one axis
    y = dy[..., None, None] + e[:, None]
    x = dx[..., None, None] + e[None, :]
    return (torch.sqrt(y**2 + x**2) * (w[:, None] * w[None, :])).sum((-1, -2))


def patch_distance_matrix(grid: tuple[int, int], patch_pixels: float, mode: str = "centres") -> Tensor:
    """(N, N) distance in pixels between the N = gh*gw patches, by `mode` (see above)."""
    if mode not in MODES:
        raise ValueError(f"attention distance mode {mode!r}: use one of {', '.join(MODES)}")
    gh, gw = grid
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    centres = torch.stack([ys.flatten(), xs.flatten()], 1) * patch_pixels  # (N, 2)
    if mode == "centres":
        return torch.cdist(centres, centres)
    if float(patch_pixels) != int(patch_pixels):
        raise ValueError(f"the pixels mode needs a whole number of pixels per patch, got {patch_pixels}")
    d = centres[:, None, :] - centres[None, :, :]  # (N, N, 2)
    return _pixel_pair_mean(d[..., 0], d[..., 1], int(patch_pixels))


def uniform_distance(grid: tuple[int, int], patch_pixels: float, mode: str = "centres") -> float:
    """The mean attention distance of uniform attention over the patches."""
    return float(patch_distance_matrix(grid, patch_pixels, mode).mean())


class AttentionDistance:
    """Accumulates the mean attention distance over batches of images.

    `update(attentions)` takes the per-block attention list from
    `model(x, return_intermediates=True)["attentions"]` (each (B, heads, T, T));
    `result()` gives (layers, heads) distances in pixels.
    """

    def __init__(self, grid: tuple[int, int], patch_pixels: float, num_prefix: int, mode: str = "centres"):
        self.grid = (grid[0], grid[1])
        self.num_prefix = num_prefix
        self.mode = mode
        self.dist = patch_distance_matrix(self.grid, patch_pixels, mode)
        self.uniform = float(self.dist.mean())
        self.total: Tensor | None = None  # (L, H) sum over images of per-image means
        self.prefix_mass: Tensor | None = None
        self.count = 0

    def update(self, attentions: Sequence[Tensor]) -> None:
        n = self.dist.shape[0]
        p = self.num_prefix
        dists, masses = [], []
        for attn in attentions:  # one layer at a time: (B, H, T, T), float64 only per layer
            if attn.shape[-1] != n + p:
                raise ValueError(
                    f"attention over {attn.shape[-1]} tokens does not match a {self.grid[0]}x{self.grid[1]} "
                    f"grid with {p} prefix token(s)"
                )
            patch = attn.detach().cpu().double()[..., p:, p:]  # (B, H, N, N): patch queries and keys
            mass = patch.sum(-1, keepdim=True)  # what each query gave to patches
            per_query = ((patch / mass.clamp_min(1e-30)) * self.dist).sum(-1)  # (B, H, N)
            dists.append(per_query.mean(-1).sum(0))  # per image mean over queries, summed over images
            masses.append((1.0 - mass[..., 0]).mean(-1).sum(0))
        s, m = torch.stack(dists), torch.stack(masses)  # (L, H)
        self.total = s if self.total is None else self.total + s
        self.prefix_mass = m if self.prefix_mass is None else self.prefix_mass + m
        self.count += attentions[0].shape[0]

    def result(self) -> np.ndarray:
        return self._per_image(self.total)

    def prefix_fraction(self) -> np.ndarray:
        """(L, H) mean attention mass patch queries give the class token."""
        return self._per_image(self.prefix_mass)

    def _per_image(self, total: Tensor | None) -> np.ndarray:
        if not self.count or total is None:  # (update sets both)
            raise ValueError("no images were added")
        return (total / self.count).numpy()


def mean_attention_distance(
    attentions: Sequence[Tensor], grid: tuple[int, int], patch_pixels: float, num_prefix: int, mode: str = "centres"
) -> np.ndarray:
    """(layers, heads) mean attention distance in pixels for one batch of attentions."""
    acc = AttentionDistance(grid, patch_pixels, num_prefix, mode)
    acc.update(attentions)
    return acc.result()


def distance_depth_trend(distances: np.ndarray) -> dict:
    """Summaries of "distance grows with depth": per-layer mean and min/max over heads, and
    the Spearman rank correlation between layer index and per-layer mean distance."""
    per_layer = distances.mean(1)
    layers = np.arange(len(per_layer))
    rho = float("nan")
    if len(per_layer) > 1 and per_layer.std() > 0:
        r = np.argsort(np.argsort(per_layer)).astype(np.float64)
        rho = float(np.corrcoef(layers, r)[0, 1])
    return {
        "mean_per_layer": per_layer.tolist(),
        "min_per_layer": distances.min(1).tolist(),
        "max_per_layer": distances.max(1).tolist(),
        "spearman_depth_distance": rho,
    }
