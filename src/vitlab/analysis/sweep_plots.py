"""Drawing a sweep's figures: lines with their spread, Pareto fronts, bars, per-layer curves.

The numbers come in as plain lists (vitlab.sweep.results prepares them); each function
writes one figure with plots.py's object-API helpers. An accuracy (a column named top1, top5,
acc... with every value in [0, 1]) is drawn in %, as report.md writes it; a figure without a
title is named by its axes; each figure says what its spread shows.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from vitlab.analysis.plots import new_axes, save_figure
from vitlab.spread import mean_std

Points = list[tuple[Any, list[float]]]  # (x, the y of every cell at that x)


def _stats(ys: list[float]) -> tuple[float, float]:
    mean, std = mean_std(ys)
    return mean, std or 0.0  # one cell: no band, no error bar


def _numeric(xs: Sequence[Any]) -> bool:
    try:
        [float(x) for x in xs]
    except (TypeError, ValueError):
        return False
    return True


ACCURACY_WORDS = ("top1", "top-1", "top5", "top-5", "acc", "accuracy")


def as_percent(groups: dict[str, Points], ylabel: str) -> tuple[dict[str, Points], str]:
    """An accuracy's points in % (its label says so), as report.md writes them; others as they are."""
    ys = [y for pts in groups.values() for _, cell in pts for y in cell]
    if not ys or not any(w in ylabel.lower() for w in ACCURACY_WORDS) or not all(0 <= y <= 1 for y in ys):
        return groups, ylabel
    scaled = {k: [(x, [100 * y for y in cell]) for x, cell in pts] for k, pts in groups.items()}
    return scaled, f"{ylabel} (%)"


def _caption(fig, text: str) -> None:
    """What the figure's marks are, beneath it, wrapped to its width."""
    fig.text(0.01, -0.1, textwrap.fill(text, int(fig.get_size_inches()[0] * 72 / 4.6)), fontsize=8, ha="left",
             va="top", color="0.3")


def _finish(ax, fig, path, title: str, xlabel: str, ylabel: str, logx: bool, logy: bool, legend: bool) -> Path:
    from matplotlib.ticker import NullFormatter

    for on, axis, scale in ((logx, ax.xaxis, ax.set_xscale), (logy, ax.yaxis, ax.set_yscale)):
        if on:
            scale("log")
            # Labels at the powers of ten only: a log axis spanning less than two decades
            # otherwise labels every minor tick, and the labels run into each other.
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title or (f"{ylabel} by {xlabel}" if xlabel else ylabel), fontsize=9)
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_lines(groups: dict[str, Points], path, *, title="", xlabel="", ylabel="", logx=False, logy=False) -> Path:
    """Mean of y against x per series, with a band of +- one standard deviation over cells."""
    groups, ylabel = as_percent(groups, ylabel)
    fig, ax = new_axes(5.0, 3.6)
    categories: list[Any] = list(dict.fromkeys(x for pts in groups.values() for x, _ in pts))
    numeric = _numeric(categories)
    for label, pts in groups.items():
        xs = [float(x) if numeric else categories.index(x) for x, _ in pts]
        mean, std = map(np.asarray, zip(*(_stats(ys) for _, ys in pts), strict=True))
        line = ax.plot(xs, mean, marker="o", ms=4, label=label)[0]
        if (std > 0).any():
            ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)
    if not numeric:
        ax.set_xticks(range(len(categories)), [str(c) for c in categories], rotation=20, fontsize=8)
    _caption(fig, "Lines: mean over the cells at each x (seeds, other axes); band: +- 1 standard deviation.")
    return _finish(ax, fig, path, title, xlabel, ylabel, logx and numeric, logy, len(groups) > 1)


def plot_pareto(groups: dict[str, Points], fronts: dict[str, list[tuple[float, float]]], path, *, title="",
                xlabel="", ylabel="", logx=True, logy=False) -> Path:
    """Every cell as a faint point, the mean over the cells at each x (the seeds of one model
    and budget) with a +- one standard deviation error bar, and each series' Pareto front of
    those means as a step line (Fig. 5)."""
    groups, ylabel = as_percent(groups, ylabel)
    if ylabel.endswith("(%)"):
        fronts = {k: [(x, 100 * y) for x, y in f] for k, f in fronts.items()}
    fig, ax = new_axes(5.0, 3.6)
    for i, (label, pts) in enumerate(groups.items()):
        color = f"C{i}"
        xs = [float(x) for x, ys in pts for _ in ys]
        ys = [y for _, ys_ in pts for y in ys_]
        ax.scatter(xs, ys, s=8, alpha=0.35, color=color)
        means = [(float(x), *_stats(ys_)) for x, ys_ in pts]
        mx, my, sd = zip(*means, strict=True)
        ax.errorbar(mx, my, yerr=sd, fmt="o", ms=4, capsize=2, color=color, label=label)
        front = fronts.get(label) or []
        if front:
            fx, fy = zip(*front, strict=True)
            ax.step(fx, fy, where="post", color=color, lw=1.2)
    _caption(fig, "Points: each cell; markers: mean over the cells at an x, error bars +- 1 standard deviation; "
                  "steps: the Pareto front of the means.")
    return _finish(ax, fig, path, title, xlabel, ylabel, logx, logy, len(groups) > 1)


def plot_bars(groups: dict[str, Points], path, *, title="", xlabel="", ylabel="", logy=False) -> Path:
    """Mean of y per category (side by side per series), the standard deviation as an error
    bar, and every cell as a dot."""
    groups, ylabel = as_percent(groups, ylabel)
    fig, ax = new_axes(5.4, 3.6)
    categories: list[Any] = list(dict.fromkeys(x for pts in groups.values() for x, _ in pts))
    width = 0.8 / max(len(groups), 1)
    for i, (label, pts) in enumerate(groups.items()):
        for x, ys in pts:
            pos = categories.index(x) - 0.4 + width * (i + 0.5)
            mean, std = _stats(ys)
            ax.bar(pos, mean, width * 0.9, yerr=std, capsize=3, color=f"C{i}", alpha=0.75,
                   label=label if x == pts[0][0] else None)
            ax.scatter([pos] * len(ys), ys, s=8, color="k", zorder=3)
    ax.set_xticks(range(len(categories)), [str(c) for c in categories], rotation=20, fontsize=8)
    cells = max((len(ys) for pts in groups.values() for _, ys in pts), default=0)
    _caption(fig, f"Bars: mean over the cells of a category (up to {cells}); error bars: +- 1 standard deviation "
                  "(n-1); dots: each cell.")
    return _finish(ax, fig, path, title, xlabel, ylabel, False, logy, len(groups) > 1)


def plot_curves(curves: dict[str, list[list[float]]], path, *, title="", xlabel="", ylabel="",
                logy=False, start: Optional[int] = 1, references: Optional[dict] = None) -> Path:
    """A list-valued result (one value per layer) against its index: the mean over the
    series' cells, with a band of +- one standard deviation (Fig. 7 right, per depth).
    `references` {label: a number or a list}: dashed grey lines to read them against
    (uniform attention, the random-init model)."""
    fig, ax = new_axes(5.0, 3.6)
    for k, (label, ref) in enumerate((references or {}).items()):
        style = dict(color="0.45" if k == 0 else "0.7", ls="--" if k == 0 else ":", lw=1.2, label=label)
        if isinstance(ref, (list, tuple)):
            ax.plot(np.arange(start or 0, (start or 0) + len(ref)), ref, **style)
        else:
            ax.axhline(float(ref), **style)
    for label, cs in curves.items():
        n = min(len(c) for c in cs)
        a = np.asarray([c[:n] for c in cs], dtype=float)
        xs = np.arange(start or 0, (start or 0) + n)
        mean, std = np.asarray([_stats(column.tolist()) for column in a.T]).T  # per index, over the cells
        line = ax.plot(xs, mean, marker="o", ms=4, label=f"{label} ({len(cs)})")[0]
        if len(cs) > 1:
            ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)
    return _finish(ax, fig, path, title, xlabel, ylabel, False, logy, True)
