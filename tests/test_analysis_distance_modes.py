"""Attention distance between patch centres (the default) and over pixel pairs (the
paper's image-space distance, App. D.7), and the uniform-attention reference."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from vitlab.analysis.attention_distance import AttentionDistance, patch_distance_matrix, uniform_distance


def brute(q: int, k: int, grid: int, s: int) -> float:
    """Mean distance over every pixel of patch q and every pixel of patch k, by enumeration."""
    (qy, qx), (ky, kx) = divmod(q, grid), divmod(k, grid)
    d = [math.hypot(qy * s + a - ky * s - c, qx * s + b - kx * s - e) for a, b, c, e in itertools.product(range(s), repeat=4)]
    return sum(d) / len(d)


@pytest.mark.parametrize("grid,s", [(3, 2), (4, 3)])
def test_pixel_mode_is_the_mean_over_pixel_pairs(grid, s):
    m = patch_distance_matrix((grid, grid), s, "pixels")
    for q, k in itertools.product(range(grid * grid), repeat=2):
        assert m[q, k].item() == pytest.approx(brute(q, k, grid, s), abs=1e-12)
    centres = patch_distance_matrix((grid, grid), s)
    assert centres[0, 0] == 0 and m[0, 0] > 0  # a patch is not at distance 0 from itself in pixels


def test_uniform_attention_gives_the_reference_value():
    grid, p = (8, 8), 1
    for mode in ("centres", "pixels"):
        acc = AttentionDistance(grid, 4, p, mode)
        uniform = torch.full((2, 3, 65, 65), 1 / 65)
        acc.update([uniform, uniform])
        assert acc.result() == pytest.approx(uniform_distance(grid, 4, mode), rel=1e-9)
        assert acc.uniform == pytest.approx(uniform_distance(grid, 4, mode))
    assert uniform_distance(grid, 4) == pytest.approx(16.5459, abs=1e-3)  # the page's 16.55 px
    with pytest.raises(ValueError, match="mode"):
        patch_distance_matrix(grid, 4, "corners")
    with pytest.raises(ValueError, match="whole number"):
        patch_distance_matrix(grid, 2.5, "pixels")
