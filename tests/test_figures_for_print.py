"""Figures ready for a paper, read back from the figures vitlab writes (through the real
save_figure): no text under 8 pt, no machine's absolute path, titles no wider than their
figure, and the reference marks each figure needs to be read: uniform attention on the
attention distance, a colour bar on rollout overlays, a learning curve's loss axis in plain
numbers, and a sweep bar figure with a title, units in % and what its error bars are."""

from __future__ import annotations

import re

import numpy as np
import pytest

from vitlab.analysis import plots, sweep_plots
from vitlab.cli import main
from vitlab.train.report import figure_label

pytest.importorskip("matplotlib")


@pytest.fixture
def saved(monkeypatch):
    """Every figure written, by the name of its file, after save_figure made it ready."""
    from matplotlib.figure import Figure

    figures = {}
    real = Figure.savefig

    def keep(fig, path, *args, **kwargs):
        figures[str(path).rsplit("/", 1)[-1]] = fig
        return real(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def texts(fig) -> list:
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def assert_ready_for_print(name: str, fig) -> None:
    fig.canvas.draw()
    width = fig.bbox.width
    for t in texts(fig):
        assert t.get_fontsize() >= 8, f"{name}: {t.get_text()!r} at {t.get_fontsize()} pt"
        assert not re.search(r"(^|[\s:(])/\w+/", t.get_text()), f"{name}: an absolute path in {t.get_text()!r}"
    for title in [fig._suptitle, *(ax.title for ax in fig.axes)]:
        if title is not None and title.get_text():
            assert title.get_window_extent().width <= width + 1, f"{name}: title {title.get_text()!r} is wider than the figure"


def test_the_figures_vitlab_draws_are_ready_for_print(saved, tmp_path):
    rng = np.random.default_rng(0)
    steps = list(range(10, 110, 10))
    series = {"train": {"step": steps, "loss": list(np.linspace(2.3, 1.7, 10)), "accuracy": list(np.linspace(0.1, 0.5, 10)),
                        "lr": list(np.linspace(1e-3, 0, 10))},
              "test": {"step": [100], "loss": [1.8], "accuracy": [0.45], "lr": [float("nan")]}}
    long_title = "ViT-Ti/4 (custom: width 64, depth 4, heads 4, mlp 128) on wds:/work/shared/data/cifar10 (a-long-run-name)"
    plots.plot_learning_curve(series, tmp_path / "learning_curve.png", title=long_title)
    plots.plot_attention_distance(rng.uniform(5, 20, size=(6, 3)), tmp_path / "attention_distance.png", 4, 12.5)
    images, maps = rng.uniform(size=(3, 16, 16, 3)), rng.uniform(size=(3, 16, 16))
    plots.plot_rollout(images, maps, tmp_path / "rollout.png", ["cat", "dog", "ship"])
    plots.plot_rollout(images, maps, tmp_path / "rollout_heat.png", ["cat", "dog", "ship"], heatmap=True)
    groups = {"": [("ViT-C/4", [0.61, 0.63, 0.62]), ("BiT-R26-C", [0.58, 0.6, 0.57])]}
    sweep_plots.plot_bars(groups, tmp_path / "bars.png", xlabel="model", ylabel="test_top1")
    for name, fig in saved.items():
        assert_ready_for_print(name, fig)

    curve = saved["learning_curve.png"]
    loss_ax = curve.axes[0]
    assert loss_ax.get_yscale() == "linear"  # 1.7-2.3 is no decade: plain numbers, not 2.3x10^0
    assert "wds:cifar10" in curve._suptitle.get_text()  # the data by its kind and folder

    distance = saved["attention_distance.png"].axes[0]
    uniform = [line for line in distance.get_lines() if line.get_label().startswith("uniform attention")]
    assert uniform and np.allclose(uniform[0].get_ydata(), 12.5)

    for name in ("rollout.png", "rollout_heat.png"):
        bars = [ax for ax in saved[name].axes if ax.get_ylabel().startswith("rollout")]
        assert len(bars) == 1, name  # one colour bar for the figure's maps

    bar_ax = saved["bars.png"].axes[0]
    assert bar_ax.get_title() and bar_ax.get_ylabel() == "test_top1 (%)"
    assert max(p.get_height() for p in bar_ax.patches) > 50  # in %, as report.md
    caption = " ".join(t.get_text() for t in saved["bars.png"].texts)
    assert "error bars: +- 1 standard deviation" in caption.replace("\n", " ")


def test_inspect_figures_are_ready_for_print(saved, tmp_path, digits_run):
    """What `vitlab inspect` writes on a real model and real images: every figure, read back."""
    out = tmp_path / "inspect"
    assert main(["inspect", str(digits_run / "checkpoints" / "last.safetensors"), "--images", "digits",
                 "--out", str(out), "--num-images", "16"]) == 0
    assert {"attention_distance.png", "rollout.png", "filters.png"} <= set(saved)
    for name, fig in saved.items():
        assert_ready_for_print(name, fig)
    distance = saved["attention_distance.png"].axes[0]
    assert any(line.get_label().startswith("uniform attention") for line in distance.get_lines())
    assert any(ax.get_ylabel().startswith("rollout") for ax in saved["rollout.png"].axes)


def test_figure_titles_name_data_without_a_machines_paths():
    assert figure_label("wds:/work/shared/data/cifar10/train-{000000..000004}.tar.gz") == "wds:cifar10"
    assert figure_label("imagefolder:/home/me/photos/") == "imagefolder:photos"
    assert figure_label("vtab:dtd:/data/vtab") == "vtab:dtd" and figure_label("digits") == "digits"
