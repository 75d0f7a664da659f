"""Position-embedding resizing (§3.2): each mode checked against an independent definition."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import vitlab
from vitlab.config import RESIZE_MODES
from vitlab.models.pos_embed import resize_grid, resize_token_embedding, sincos_2d


def reference_1d(values: np.ndarray, new: int, mode: str) -> np.ndarray:
    """Resample a 1D signal by the textbook definition of each mode (no PyTorch)."""
    old = len(values)
    out = np.empty(new)
    for i in range(new):
        if mode == "bilinear_aligned":
            # the official order-1 zoom: output i reads input i (old-1)/(new-1)
            src = i * (old - 1) / (new - 1) if new > 1 else 0.0
            lo = min(int(math.floor(src)), old - 1)
            hi = min(lo + 1, old - 1)
            out[i] = values[lo] + (src - lo) * (values[hi] - values[lo])
        elif mode == "bilinear":
            # half-pixel centres, clamped at the borders
            src = max((i + 0.5) * old / new - 0.5, 0.0)
            lo = min(int(math.floor(src)), old - 1)
            hi = min(lo + 1, old - 1)
            out[i] = values[lo] + (src - lo) * (values[hi] - values[lo])
        elif mode == "bicubic":
            # Keys cubic convolution, a = -0.75, half-pixel centres, border samples repeated
            a = -0.75
            src = (i + 0.5) * old / new - 0.5
            base = math.floor(src)
            t = src - base

            def w(d, a=a):
                d = abs(d)
                if d <= 1:
                    return (a + 2) * d**3 - (a + 3) * d**2 + 1
                if d < 2:
                    return a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a
                return 0.0

            out[i] = sum(values[min(max(base + k, 0), old - 1)] * w(t - k) for k in (-1, 0, 1, 2))
        else:
            raise ValueError(mode)
    return out


def separable(grid: np.ndarray, new: tuple[int, int], mode: str) -> np.ndarray:
    rows = np.stack([reference_1d(grid[:, j], new[0], mode) for j in range(grid.shape[1])], axis=1)
    return np.stack([reference_1d(rows[i], new[1], mode) for i in range(new[0])], axis=0)


@pytest.mark.parametrize("mode", RESIZE_MODES)
def test_same_size_is_identity(mode):
    pos = torch.randn(1, 1 + 7 * 5, 8)
    assert torch.equal(resize_token_embedding(pos, (7, 5), (7, 5), 1, mode), pos)


@pytest.mark.parametrize("mode", ["bilinear_aligned", "bilinear", "bicubic"])
@pytest.mark.parametrize("new", [(11, 9), (4, 6), (7, 10)])
def test_each_mode_matches_its_definition(mode, new):
    rng = np.random.default_rng(0)
    grid = rng.standard_normal((7, 5))
    got = resize_grid(torch.tensor(grid, dtype=torch.float64)[:, :, None], new, mode)[:, :, 0].numpy()
    np.testing.assert_allclose(got, separable(grid, new, mode), atol=1e-6)


@pytest.mark.parametrize("new", [(4, 3), (12, 14)])
def test_bicubic_antialias_matches_pil(new):
    """Antialiased bicubic is defined as PIL's resampling filter (a = -0.5, widened when shrinking)."""
    from PIL import Image

    rng = np.random.default_rng(1)
    grid = rng.standard_normal((9, 7)).astype(np.float32)
    want = np.asarray(Image.fromarray(grid, mode="F").resize((new[1], new[0]), Image.BICUBIC))
    got = resize_grid(torch.tensor(grid)[:, :, None], new, "bicubic_antialias")[:, :, 0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_aligned_bilinear_keeps_corners_and_reproduces_a_linear_ramp():
    gh, gw = 6, 4
    i, j = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    ramp = 3.0 * i - 2.0 * j + 1.0
    got = resize_grid(torch.tensor(ramp)[:, :, None], (11, 7), "bilinear_aligned")[:, :, 0].numpy()
    ii, jj = np.meshgrid(np.arange(11) * (gh - 1) / 10, np.arange(7) * (gw - 1) / 6, indexing="ij")
    np.testing.assert_allclose(got, 3.0 * ii - 2.0 * jj + 1.0, atol=1e-12)


def test_token_embedding_keeps_class_row_and_raster_order():
    pos = torch.arange(1 + 2 * 3, dtype=torch.float64).reshape(1, 7, 1)
    out = resize_token_embedding(pos, (2, 3), (3, 5), 1, "bilinear_aligned")
    assert out.shape == (1, 16, 1) and out[0, 0, 0] == 0
    grid = out[0, 1:, 0].reshape(3, 5)
    # corners of the new grid are the old corners: rows 1..3 / 4..6 of the raster order
    assert grid[0, 0] == 1 and grid[0, -1] == 3 and grid[-1, 0] == 4 and grid[-1, -1] == 6


@pytest.mark.parametrize("pos_embed", ["learned", "learned_2d", "relative", "sincos_2d"])
def test_creating_at_a_new_size_through_load_resizes(tmp_path, pos_embed):
    torch.manual_seed(0)
    model = vitlab.create_model("ViT-C/4", image_size=16, depth=1, pos_embed=pos_embed, head_init="xavier")
    path = tmp_path / "m.safetensors"
    vitlab.save(model, path)
    big = vitlab.load(path, image_size=(24, 32))
    assert big.config.grid_size == (6, 8)
    assert big(torch.randn(1, 3, 24, 32)).shape == (1, 10)
    if pos_embed == "learned":
        want = resize_token_embedding(model.pos_embed.pos_embedding.detach(), (4, 4), (6, 8), 1, "bilinear_aligned")
        torch.testing.assert_close(big.pos_embed.pos_embedding.detach(), want)


def test_sincos_is_nearer_more_similar():
    table = sincos_2d((8, 8), 64)
    sim = torch.nn.functional.cosine_similarity(table[:, None], table[None], dim=-1).reshape(8, 8, 8, 8)
    centre = sim[4, 4]
    assert centre[4, 5] > centre[4, 7] and centre[5, 4] > centre[7, 4] and centre[4, 4] == pytest.approx(1.0)
