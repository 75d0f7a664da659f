"""Known-answer tests of the paper's analyses (§4.5, Fig. 6/7, App. D.7/D.8)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import tiny_model
from test_models_pos_embed import ABSOLUTE, KINDS
from vitlab import analysis
from vitlab.config import POS_EMBEDS, ResNetConfig
from vitlab.models.pos_embed import sincos_2d
from vitlab.models.vit import VisionTransformer


def tiny(**kw) -> VisionTransformer:
    return tiny_model(**{"image_size": (16, 24), "depth": 3, "num_classes": 5, **kw})


def with_prefix(patch_attn: torch.Tensor, prefix: int) -> torch.Tensor:
    """Embed (B, H, N, N) patch attention into (B, H, p+N, p+N), prefix rows attending to themselves."""
    b, h, n, _ = patch_attn.shape
    full = torch.zeros(b, h, prefix + n, prefix + n, dtype=patch_attn.dtype)
    full[..., prefix:, prefix:] = patch_attn
    for i in range(prefix):
        full[..., i, i] = 1.0
    return full


# Mean attention distance -------------------------------------------------------------------
@pytest.mark.parametrize("prefix", [0, 1])
def test_attention_to_itself_has_distance_zero(prefix):
    grid, n = (3, 4), 12
    eye = torch.eye(n).expand(2, 3, n, n)
    attn = [with_prefix(eye, prefix)] * 4
    d = analysis.mean_attention_distance(attn, grid, 16, prefix)
    assert d.shape == (4, 3)
    np.testing.assert_allclose(d, 0.0, atol=1e-12)


def test_uniform_attention_gives_mean_pairwise_distance():
    grid, px = (3, 5), 16
    n = grid[0] * grid[1]
    # Independently: every ordered pair of cells (including a cell with itself), Euclidean
    # distance between centres in pixels, averaged.
    cells = [(r, c) for r in range(grid[0]) for c in range(grid[1])]
    expected = sum(math.hypot((r1 - r2) * px, (c1 - c2) * px) for r1, c1 in cells for r2, c2 in cells) / n**2
    uniform = torch.full((1, 2, n + 1, n + 1), 1.0 / (n + 1))  # class token included, uniform over all
    d = analysis.mean_attention_distance([uniform, uniform], grid, px, 1)
    np.testing.assert_allclose(d, expected, rtol=1e-9)


def test_attention_to_right_neighbour():
    # Each patch attends only to its right neighbour (last column: to itself): distance is
    # one patch width for (gw - 1) of gw columns.
    grid, px = (2, 4), 8
    n = 8
    a = torch.zeros(1, 1, n, n)
    for i in range(n):
        r, c = divmod(i, grid[1])
        a[0, 0, i, r * grid[1] + min(c + 1, grid[1] - 1)] = 1.0
    d = analysis.mean_attention_distance([a], grid, px, 0)
    assert d[0, 0] == pytest.approx(px * (grid[1] - 1) / grid[1])


def test_class_token_mass_is_reported_and_excluded():
    grid, n = (2, 2), 4
    a = torch.zeros(1, 1, n + 1, n + 1)
    a[0, 0, 0, :] = 1.0 / (n + 1)
    a[0, 0, 1:, 0] = 0.5  # half of every patch's attention goes to the class token
    a[0, 0, 1:, 1:] = 0.5 * torch.eye(n)  # the other half to itself
    acc = analysis.AttentionDistance(grid, 16, 1)
    acc.update([a])
    np.testing.assert_allclose(acc.result(), 0.0, atol=1e-12)
    np.testing.assert_allclose(acc.prefix_fraction(), 0.5)


def test_attention_distance_averages_images():
    grid, n = (2, 2), 4
    eye = torch.eye(n)[None, None]
    uni = torch.full((1, 1, n, n), 0.25)
    acc = analysis.AttentionDistance(grid, 10, 0)
    acc.update([torch.cat([eye, uni])])
    # uniform on a 2x2 grid: distances 0,10,10,10*sqrt2 from each cell -> mean (20 + 10*sqrt2) / 4
    expected = 0.5 * (0 + (20 + 10 * math.sqrt(2)) / 4)
    assert acc.result()[0, 0] == pytest.approx(expected)
    assert acc.count == 2


def test_distance_mismatch_is_an_error():
    with pytest.raises(ValueError, match="does not match"):
        analysis.mean_attention_distance([torch.eye(5)[None, None]], (3, 3), 16, 1)


# Attention rollout --------------------------------------------------------------------------
def test_rollout_of_identity_attention_is_identity():
    t = 7
    eye = torch.eye(t).expand(2, 4, t, t)
    r = analysis.rollout_matrix([eye] * 5)
    torch.testing.assert_close(r, torch.eye(t, dtype=torch.float64).expand(2, t, t))
    # class token: its row puts everything on itself, nothing on patches.
    maps = analysis.attention_rollout([eye] * 5, (2, 3), 1)
    np.testing.assert_allclose(maps, 0.0)
    # GAP (no prefix): each patch keeps itself; the mean over patch rows is uniform -> all 1
    eye6 = torch.eye(6).expand(1, 2, 6, 6)
    np.testing.assert_allclose(analysis.attention_rollout([eye6] * 3, (2, 3), 0), 1.0)


def test_rollout_of_uniform_attention_has_closed_form():
    # Â = (U + I) / 2 with U the uniform matrix; U² = U, so Â^L = 2^-L I + (1 - 2^-L) U.
    t, layers = 5, 3
    u = torch.full((1, 1, t, t), 1.0 / t)
    r = analysis.rollout_matrix([u] * layers)[0]
    expected = 0.5**layers * torch.eye(t, dtype=torch.float64) + (1 - 0.5**layers) / t
    torch.testing.assert_close(r, expected)


def test_rollout_matches_a_direct_computation():
    g = torch.Generator().manual_seed(1)
    t, heads, layers = 5, 3, 4
    attn = [torch.rand(2, heads, t, t, generator=g).softmax(-1) for _ in range(layers)]
    r = analysis.rollout_matrix(attn).numpy()
    for b in range(2):
        ref = np.eye(t)
        for a in attn:
            m = a[b].double().numpy().mean(0) + np.eye(t)
            m = m / m.sum(1, keepdims=True)
            ref = m @ ref
        np.testing.assert_allclose(r[b], ref, rtol=1e-10)
        np.testing.assert_allclose(r[b].sum(1), 1.0)  # rows stay distributions
    maps = analysis.attention_rollout(attn, (2, 2), 1)
    np.testing.assert_allclose(maps[0].ravel(), r[0, 0, 1:] / r[0, 0, 1:].max(), rtol=1e-6)


def test_upsample_map_keeps_a_constant_map():
    up = analysis.upsample_map(np.ones((2, 3, 4)), (12, 16))
    assert up.shape == (2, 12, 16)
    np.testing.assert_allclose(up, 1.0, rtol=1e-6)


# Position-embedding similarity --------------------------------------------------------------
def test_sincos_similarity_is_higher_for_nearer_positions():
    grid = (8, 8)
    sim = analysis.cosine_similarity_grid(sincos_2d(grid, 64), grid)
    np.testing.assert_allclose([sim[i, j, i, j] for i in range(8) for j in range(8)], 1.0, rtol=1e-5)
    for i in range(8):
        for j in range(8):
            near = [sim[i, j, k, m] for k in range(8) for m in range(8) if abs(k - i) + abs(m - j) == 1]
            far = [sim[i, j, k, m] for k in range(8) for m in range(8) if math.hypot(k - i, m - j) >= 3]
            assert min(near) > max(far), (i, j)
    summary = analysis.similarity_vs_distance(sim)
    assert summary["pearson_distance_similarity"] < -0.5
    assert summary["mean_similarity"][0] > summary["mean_similarity"][-1]


def test_random_table_shows_no_distance_structure():
    g = torch.Generator().manual_seed(0)
    sim = analysis.cosine_similarity_grid(torch.randn(64, 256, generator=g), (8, 8))
    assert abs(analysis.similarity_vs_distance(sim)["pearson_distance_similarity"]) < 0.1


@pytest.mark.parametrize("kind", POS_EMBEDS)
def test_position_table_for_each_kind(kind):
    """The table of an absolute kind is the one its definition adds to the patch tokens (the
    class token's row left out); a kind with none says why."""
    model = tiny(pos_embed=kind)
    if kind not in ABSOLUTE:
        with pytest.raises(analysis.NoPositionTable, match=f"pos_embed='{kind}'"):
            analysis.position_table(model)
        return
    table = analysis.position_table(model)
    assert table.shape == (model.config.num_patches, 32)
    want = KINDS[kind].table(model.pos_embed, model.config.grid_size, 32)[1:]
    np.testing.assert_allclose(table.double().numpy(), want, atol=1e-6)
    sim = analysis.cosine_similarity_grid(table, model.config.grid_size)
    assert sim.shape == (4, 6, 4, 6)


# Embedding filters ---------------------------------------------------------------------------
def test_filter_pca_recovers_the_patterns_the_filters_are_made_of():
    g = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(48, 3, generator=g, dtype=torch.float64))[0].T  # 3 orthonormal patterns
    coeff = torch.randn(200, 3, generator=g, dtype=torch.float64) * torch.tensor([5.0, 2.0, 1.0])
    w = (coeff @ basis + 1e-4 * torch.randn(200, 48, generator=g, dtype=torch.float64)).reshape(200, 3, 4, 4)
    comps, explained = analysis.filter_principal_components(w, 5)
    assert comps.shape == (5, 4, 4, 3)
    assert explained[:3].sum() > 0.999 and explained[0] > explained[1] > explained[2]
    flat = torch.from_numpy(comps[:3]).double().permute(0, 3, 1, 2).reshape(3, 48)
    # The top-3 components span the same space as the patterns.
    proj = flat @ basis.T @ basis
    torch.testing.assert_close(proj, flat, atol=1e-3, rtol=0)


def test_hybrid_shows_its_root_convolution():
    model = tiny(patch_size=1, resnet=ResNetConfig(layers=(1,), gn_groups=8), image_size=(16, 16))
    f = analysis.embedding_filters(model, 6)
    assert "ResNet root convolution" in f.source and f.components.shape == (6, 7, 7, 3)
    f = analysis.embedding_filters(tiny(), 6)
    assert f.source.startswith("patch embedding") and f.components.shape == (6, 4, 4, 3)


# The model's own attention path ----------------------------------------------------------------
@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_analyse_model_uses_the_exact_attention(classifier):
    model = tiny(classifier=classifier)
    x = torch.randn(5, 3, 16, 24, generator=torch.Generator().manual_seed(0))
    out = model(x, return_intermediates=True)
    for a in out["attentions"]:
        torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[:-1]))
    res = analysis.analyse_model(model, [x[:3], x[3:]], max_images=4, rollout_images=2)
    assert res.num_images == 4
    assert res.distances.shape == (3, 2)
    max_dist = math.hypot(3 * 4, 5 * 4)
    assert (res.distances > 0).all() and (res.distances < max_dist).all()
    # The accumulated distance equals a single pass over the same four images.
    direct = analysis.mean_attention_distance([a[:4] for a in out["attentions"]], (4, 6), 4, model.num_prefix_tokens)
    np.testing.assert_allclose(res.distances, direct, rtol=1e-5)
    assert res.rollout_maps.shape == (2, 4, 6) and np.allclose(res.rollout_maps.max((1, 2)), 1.0)
    numbers = res.numbers()
    assert numbers["attention_distance"]["num_images"] == 4


def test_plots_and_html(tmp_path):
    pytest.importorskip("matplotlib")
    from vitlab.analysis import plots
    from vitlab.analysis.page import write_html

    model = tiny()
    x = torch.randn(2, 3, 16, 24)
    res = analysis.analyse_model(model, [x], rollout_images=2)
    pngs = [
        plots.plot_filters(res.filters.components, tmp_path / "f.png", res.filters.source, res.filters.explained),
        plots.plot_position_similarity(res.pos_similarity, tmp_path / "p.png"),
        plots.plot_attention_distance(res.distances, tmp_path / "d.png", 4),
        plots.plot_rollout(
            analysis.display_images(x, model.config.mean, model.config.std),
            analysis.upsample_map(res.rollout_maps, (16, 24)),
            tmp_path / "r.png",
            ["a", "b"],
        ),
    ]
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = write_html(tmp_path / "index.html", "t", {"model": "tiny"}, [analysis.Figure("f", "F", pngs[0], "cap")])
    text = page.read_text()
    assert "data:image/png;base64," in text and "<td>tiny</td>" in text
