"""Position embeddings (Eq. 1, App. D.4) and their resizing (§3.2): each registered kind and
each resize mode checked against an independent definition, and every kind tested."""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import numpy as np
import pytest
import torch

import vitlab
from vitlab.config import POS_EMBEDS, RESIZE_MODES
from vitlab.models.pos_embed import PositionEmbedding, resize_grid, resize_token_embedding, sincos_2d


class Kind(NamedTuple):
    """A kind written from its definition: the (T, D) table Eq. 1 adds to the tokens of a
    (gh, gw) grid of width D (the class token's row first), None for a kind that adds nothing
    to them, and how many parameters the embedding learns."""

    table: Optional[Callable[[PositionEmbedding, tuple[int, int], int], np.ndarray]]
    parameters: Callable[[tuple[int, int], int], int]


def _cells(grid: tuple[int, int], d: int, cell: Callable[[int, int], np.ndarray]) -> np.ndarray:
    """The class token's row (zero: its own embedding tells it apart) and one row per cell in
    raster order."""
    return np.concatenate([np.zeros((1, d)), np.stack([cell(y, x) for y in range(grid[0]) for x in range(grid[1])])])


def _sincos(y: int, x: int, d: int) -> np.ndarray:
    """sin(y w), cos(y w), sin(x w), cos(x w), each over d/4 frequencies w_i = 10000^(-i/(d/4))."""
    w = 1.0 / 10000 ** (np.arange(d // 4) / (d // 4))
    return np.concatenate([np.sin(y * w), np.cos(y * w), np.sin(x * w), np.cos(x * w)])


def _sincos_big_vision(y: int, x: int, d: int) -> np.ndarray:
    """big_vision's posemb_sincos_2d (models/vit.py, MoCo v3's): x before y, and
    omega = arange(d/4) / (d/4 - 1), so the frequencies run from 1 down to exactly 1/10000."""
    w = 1.0 / 10000 ** (np.arange(d // 4) / (d // 4 - 1))
    return np.concatenate([np.sin(x * w), np.cos(x * w), np.sin(y * w), np.cos(y * w)])


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


# Every kind of POS_EMBEDS must be here (test_every_kind_is_tested, as vit_jax's
# test_all_tested): a new kind cannot land without its definition.
KINDS: dict[str, Kind] = {
    "learned": Kind(lambda pe, grid, d: _np(pe.pos_embedding[0]), lambda grid, d: (1 + grid[0] * grid[1]) * d),
    "learned_2d": Kind(lambda pe, grid, d: _cells(grid, d, lambda y, x: np.concatenate(
        [_np(pe.row_embedding[y]), _np(pe.col_embedding[x])])), lambda grid, d: (grid[0] + grid[1]) * d // 2),
    "sincos_2d": Kind(lambda pe, grid, d: _cells(grid, d, lambda y, x: _sincos(y, x, d)), lambda grid, d: 0),
    "sincos_2d_big_vision": Kind(lambda pe, grid, d: _cells(grid, d, lambda y, x: _sincos_big_vision(y, x, d)),
                                 lambda grid, d: 0),
    # Relative attention adds q . r_{i-j} to the attention logits, not to the tokens
    # (test_models_vit.py: test_relative_attention_adds_query_dot_offset_embedding).
    "relative": Kind(None, lambda grid, d: 0),
    "none": Kind(None, lambda grid, d: 0),
}
# The kinds with a table of absolute positions (what pos_embed_at may repeat at every block).
ABSOLUTE = [k for k in POS_EMBEDS if k in KINDS and KINDS[k].table is not None]


def test_every_kind_is_tested():
    untested = sorted(set(POS_EMBEDS) - set(KINDS))
    assert not untested, f"position-embedding kinds without a definition in KINDS: {untested}"
    assert sorted(KINDS) == sorted(POS_EMBEDS), "KINDS lists a kind POS_EMBEDS no longer has"


@pytest.mark.parametrize("kind", POS_EMBEDS)
def test_each_kind_adds_what_its_definition_says(kind):
    torch.manual_seed(0)
    grid, d = (3, 5), 16
    model = vitlab.create_model("ViT-C/4", image_size=(12, 20), hidden_size=d, num_heads=2, mlp_dim=32, depth=1,
                                pos_embed=kind)
    pe = model.pos_embed
    x = torch.randn(2, 1 + grid[0] * grid[1], d)
    with torch.no_grad():
        added = _np(pe(x, grid) - x)
    table = KINDS[kind].table
    want = np.zeros(added.shape[1:]) if table is None else table(pe, grid, d)
    np.testing.assert_allclose(added, np.broadcast_to(want, added.shape), atol=1e-6)
    assert sum(p.numel() for p in pe.parameters()) == KINDS[kind].parameters(grid, d)


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


@pytest.mark.parametrize("pos_embed", POS_EMBEDS)
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
