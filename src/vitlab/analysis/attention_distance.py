"""Fig. 7 (right) and App. D.7: mean attention distance, per layer and head.

For a query patch, the attention-weighted average of the image-space distance (in pixels,
between patch centres) to the patches it attends to; averaged over all query patches and
over images (the paper uses 128). Analogous to receptive-field size in a CNN: the paper
finds some heads attend globally already in the lowest layers, and distance grows with depth.

The class token has no place in the image, so it is left out on both sides: its own row
(the class token as a query) is dropped, and its column (patches attending to the class
token) is dropped and each remaining row renormalised to sum to 1. The distance is thus
"how far away are the patches this query reads, given it reads patches". The attention
mass that went to the class token is returned separately so nothing is hidden.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor


def patch_distance_matrix(grid: tuple[int, int], patch_pixels: float) -> Tensor:
    """(N, N) Euclidean distance in pixels between the centres of the N = gh*gw patches."""
    gh, gw = grid
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    centres = torch.stack([ys.flatten(), xs.flatten()], 1) * patch_pixels  # (N, 2)
    return torch.cdist(centres, centres)


class AttentionDistance:
    """Accumulates the mean attention distance over batches of images.

    `update(attentions)` takes the per-block attention list from
    `model(x, return_intermediates=True)["attentions"]` (each (B, heads, T, T));
    `result()` gives (layers, heads) distances in pixels.
    """

    def __init__(self, grid: tuple[int, int], patch_pixels: float, num_prefix: int):
        self.grid = tuple(grid)
        self.num_prefix = num_prefix
        self.dist = patch_distance_matrix(self.grid, patch_pixels)
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
        if not self.count:
            raise ValueError("no images were added")
        return (self.total / self.count).numpy()

    def prefix_fraction(self) -> np.ndarray:
        """(L, H) mean attention mass patch queries give the class token."""
        if not self.count:
            raise ValueError("no images were added")
        return (self.prefix_mass / self.count).numpy()


def mean_attention_distance(
    attentions: Sequence[Tensor], grid: tuple[int, int], patch_pixels: float, num_prefix: int
) -> np.ndarray:
    """(layers, heads) mean attention distance in pixels for one batch of attentions."""
    acc = AttentionDistance(grid, patch_pixels, num_prefix)
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
