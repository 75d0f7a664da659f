"""The analysis figures say what they show: filters named by their channels, an attention
distance legend beside the axes, rollouts as a heat map on request, overlays headed by the
predicted class."""

from __future__ import annotations

import numpy as np
import pytest

from vitlab.analysis import overlay, plots

pytest.importorskip("matplotlib")


@pytest.fixture
def drawn(monkeypatch):
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig) or path)
    return figures


@pytest.mark.parametrize("channels,kind", [(1, "Greyscale"), (3, "RGB"), (4, "4-channel")])
def test_filters_are_named_by_their_channels(drawn, channels, kind):
    plots.plot_filters(np.random.default_rng(0).normal(size=(6, 4, 4, channels)), "f.png", "patch embedding")
    title = drawn[0]._suptitle.get_text()
    assert title.startswith(f"{kind} embedding filters") and ("RGB" in title) == (channels == 3)


def test_attention_distance_legend_sits_beside_the_points(drawn):
    plots.plot_attention_distance(np.random.default_rng(0).uniform(5, 20, size=(6, 4)), "d.png", 4)
    ax = drawn[0].axes[0]
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["head 1", "head 2", "head 3", "head 4", "mean over heads"]
    assert legend.get_bbox_to_anchor().x0 > ax.get_window_extent().x1 - 1  # outside the axes: covers no point
    assert min(t.get_fontsize() for t in legend.get_texts()) >= 7
    colours = {tuple(np.round(c.get_facecolor()[0], 3)) for c in ax.collections}
    assert len(colours) == 4  # one colour per head


def test_rollout_can_be_a_heat_map(drawn):
    images = np.random.default_rng(0).uniform(size=(2, 8, 8, 3))
    maps = np.random.default_rng(1).uniform(size=(2, 8, 8))
    plots.plot_rollout(images, maps, "r.png", ["cat\npredicted: dog", "dog\npredicted: dog"], heatmap=True)
    plots.plot_rollout(images, maps, "r.png", ["cat", "dog"])
    heat, weighted = drawn
    assert heat.axes[1].get_title() == "rollout heat map" and len(heat.axes[1].images) == 2  # image + map
    # the one colour map every attention picture uses (predict's and serve's overlays too)
    assert heat.axes[1].images[1].get_cmap().name == overlay.colormap().name
    assert weighted.axes[1].get_title() == "image x rollout" and len(weighted.axes[1].images) == 1
    assert heat.axes[0].get_title() == "cat\npredicted: dog"
