"""Drawing the analyses (Figures 6 and 7) and the training and evaluation figures (learning
curve, confusion matrix). With mpp_plot.py, sweep_plots.py and overlay.py's colour map, the only
modules of vitlab that import matplotlib (inside the functions that draw).

Each function takes the numbers the analysis functions return and writes one PNG. Figures
are built with matplotlib's object API (no pyplot), so nothing global changes and no
display is needed. `save_figure` makes every figure ready for a paper in one place: no text
smaller than MIN_FONT_PT, no machine's absolute path in any text (its last part is kept), and
titles wrapped to the figure's width.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from vitlab.analysis.overlay import colormap
from vitlab.extras import require


def new_figure(width: float, height: float):
    require("plots", "drawing figures", modules=())  # a MissingExtraError (an ImportError) names the module
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def new_axes(width: float, height: float):
    """A figure of one plot: the figure and its axes."""
    fig = new_figure(width, height)
    return fig, fig.add_subplot(1, 1, 1)


MIN_FONT_PT = 8  # the smallest text a printed figure stays readable at
ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[^\s/:,()]+/)+([^\s/:,()]+)")


def for_print(fig) -> None:
    """Every text of `fig` at least MIN_FONT_PT, without absolute paths, and each title
    wrapped to the width of what it heads (the figure, or its axes)."""
    from matplotlib.text import Text

    width_in = fig.get_size_inches()[0]
    titles = {id(t): width_in for t in [fig._suptitle] if t is not None}
    for ax in fig.axes:
        share = ax.get_position().width * width_in
        titles.update({id(ax.title): share, id(ax._left_title): share, id(ax._right_title): share})
    for text in fig.findobj(Text):
        if text.get_fontsize() < MIN_FONT_PT:
            text.set_fontsize(MIN_FONT_PT)
        words = ABSOLUTE_PATH.sub(r"\1", text.get_text())
        if id(text) in titles and words:
            chars = max(int(titles[id(text)] * 72 / (0.55 * text.get_fontsize())), 16)
            words = "\n".join(textwrap.fill(line, chars) for line in words.split("\n"))
        if words != text.get_text():
            text.set_text(words)


def save_figure(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for_print(fig)
    fig.savefig(path, dpi=fig.dpi, bbox_inches="tight")
    return path


def _tile(img: np.ndarray) -> np.ndarray:
    """Scale one component to [0, 1] for display (a PC's sign and scale are arbitrary)."""
    lo, hi = img.min(), img.max()
    return (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)


def plot_filters(
    components: np.ndarray, path, source: str = "", explained: Optional[np.ndarray] = None, cols: int = 7
) -> Path:
    """Fig. 7 (left): components (k, P, P, C) as P x P tiles (colour for C = 3)."""
    k = len(components)
    cols = min(cols, k)
    rows = -(-k // cols)
    fig = new_figure(cols * 0.9 + 0.4, rows * 0.9 + 0.7)
    for i, comp in enumerate(components):
        ax = fig.add_subplot(rows, cols, i + 1)
        c = comp.shape[-1]
        if c == 3:
            ax.imshow(_tile(comp), interpolation="nearest")
        else:  # greyscale or many channels: show the channel mean
            ax.imshow(_tile(comp.mean(-1)), cmap="gray", interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        if explained is not None:
            ax.set_title(f"{100 * explained[i]:.1f}%", fontsize=8, pad=1)
    channels = components.shape[-1] if k else 0
    kind = {1: "Greyscale", 3: "RGB"}.get(channels, f"{channels}-channel")
    shown = "" if channels in (1, 3) else ", channel mean shown"
    fig.suptitle(f"{kind} embedding filters (first {k} principal components{shown})\n{source}", fontsize=8)
    return save_figure(fig, path)


def plot_position_similarity(sim: np.ndarray, path, title: str = "Position embedding similarity") -> Path:
    """Fig. 7 (centre): one small gh x gw map per grid position, laid out on the grid."""
    gh, gw = sim.shape[:2]
    pad = 1
    big = np.full((gh * (gh + pad) - pad, gw * (gw + pad) - pad), np.nan)
    for i in range(gh):
        for j in range(gw):
            y, x = i * (gh + pad), j * (gw + pad)
            big[y : y + gh, x : x + gw] = sim[i, j]
    size = min(7.0, 1.5 + 0.35 * max(gh, gw))
    fig, ax = new_axes(size + 1.0, size)
    im = ax.imshow(big, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks([(j * (gw + pad)) + gw / 2 - 0.5 for j in range(gw)], [str(j + 1) for j in range(gw)], fontsize=8)
    ax.set_yticks([(i * (gh + pad)) + gh / 2 - 0.5 for i in range(gh)], [str(i + 1) for i in range(gh)], fontsize=8)
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="Cosine similarity")
    return save_figure(fig, path)


def plot_attention_distance(distances: np.ndarray, path, pixels: Optional[int] = None,
                            uniform: Optional[float] = None) -> Path:
    """Fig. 7 (right): mean attention distance per head against network depth.

    One colour per head (with up to 16 heads, a legend beside the axes names them); the black
    line is the mean over heads; the dashed grey line, `uniform`, is the distance of uniform
    attention over the patches (what a randomly initialised model's heads sit near), the
    reference every head is read against."""
    layers, heads = distances.shape
    legend = heads <= 16
    fig, ax = new_axes(5.8 if legend else 4.5, 3.6)
    x = np.arange(1, layers + 1)
    colours = _colours(heads)
    for h in range(heads):
        ax.scatter(x, distances[:, h], s=14, color=colours[h], label=f"head {h + 1}")
    ax.plot(x, distances.mean(1), color="black", linewidth=1.2, alpha=0.8, label="mean over heads")
    if uniform is not None and np.isfinite(uniform):
        ax.axhline(uniform, color="0.45", ls="--", lw=1.2, label=f"uniform attention ({uniform:.1f} px)")
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_ylim(bottom=0)  # from 0, as the paper's Fig. 7: a 0.5 px spread is not drawn as the axis's whole height
    ax.set_xticks(x)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, frameon=False,
                  ncol=1 if heads <= 8 else 2, title="per head", title_fontsize=8)
    elif uniform is not None and np.isfinite(uniform):
        ax.legend(handles=ax.get_lines(), fontsize=8, loc="lower right")
    ax.set_title("Mean attention distance" + (f" ({pixels} px patches)" if pixels else ""), fontsize=9)
    return save_figure(fig, path)


def _colours(n: int) -> list:
    """n distinguishable colours: tab10 up to 10, tab20 up to 20, then a continuous map."""
    from matplotlib import colormaps

    name = "tab10" if n <= 10 else "tab20" if n <= 20 else "viridis"
    cmap = colormaps[name]
    return [cmap(i if n <= 20 else i / max(n - 1, 1)) for i in range(n)]


def plot_rollout(images: np.ndarray, maps: np.ndarray, path, titles: Optional[Sequence[str]] = None,
                 heatmap: bool = False) -> Path:
    """Fig. 6: each input next to the image weighted by its upsampled rollout map (or, with
    `heatmap`, the map as a colour heat map over the image).

    images: (R, H, W, C) in [0, 1]; maps: (R, H, W) in [0, 1].
    """
    r = len(images)
    cols = min(r, 4)
    rows = -(-r // cols)
    lines = max((str(t).count("\n") + 1 for t in titles or ()), default=1)  # each row leaves its titles room
    title_in = 0.16 * lines + 0.1
    fig = new_figure(cols * 2.4 + 0.8, rows * (1.2 + title_in) + 0.3)
    fig.subplots_adjust(hspace=title_in / 1.2 + 0.05, top=1 - 0.3 / (rows * (1.2 + title_in) + 0.3))
    drawn = None
    for i in range(r):
        img = _rgb(images[i])
        smooth = "nearest" if img.shape[0] < 64 else "bilinear"
        for k in range(2):
            ax = fig.add_subplot(rows, 2 * cols, 2 * i + k + 1)
            ax.set_xticks([])
            ax.set_yticks([])
            if k == 0:
                ax.imshow(img, interpolation=smooth)
                if titles:
                    ax.set_title(titles[i], fontsize=8, pad=2)
                continue
            drawn = _draw_map(ax, img, maps[i], heatmap, smooth)
            ax.set_title("rollout heat map" if heatmap else "image x rollout", fontsize=8, pad=2)
    _rollout_colour_bar(fig, heatmap, drawn)
    fig.suptitle("Attention rollout", fontsize=9, y=1.0 + 0.12 / rows)  # above two-line image titles
    return save_figure(fig, path)


def _rollout_colour_bar(fig, heatmap: bool, drawn) -> None:
    """One colour bar for every map of the figure: the heat map's colours, or for the image
    weighted by the map, the brightness a weight leaves (1: the pixel as it is, 0: black)."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    scale = drawn if heatmap and drawn is not None else ScalarMappable(Normalize(0, 1), "gray")
    label = "rollout (1: most attended)" if heatmap else "rollout weight"
    fig.colorbar(scale, ax=fig.axes, fraction=0.03, pad=0.02, label=label)


def _rgb(image: np.ndarray) -> np.ndarray:
    return np.clip(np.repeat(image, 3, -1) if image.shape[-1] == 1 else image, 0, 1)


def _draw_map(ax, image: np.ndarray, amap: np.ndarray, heatmap: bool, smooth: str = "bilinear"):
    """The rollout on `ax`: a heat map over the image, or the image weighted by the map."""
    if heatmap:
        ax.imshow(image, interpolation=smooth)
        return ax.imshow(amap, cmap=colormap(), alpha=0.55, vmin=0, vmax=1, interpolation=smooth)  # overlay.py's colours
    return ax.imshow(np.clip(image * amap[..., None], 0, 1), interpolation=smooth)


def plot_learning_curve(series: dict[str, dict[str, list]], path, title: str = "",
                        accuracy_label: str = "top-1 accuracy") -> Path:
    """Loss and accuracy against step: the training windows as lines, every evaluation as
    points, and the learning rate on a second axis of the loss panel; a series of one record
    is a point, and where no series has two the panels say "too few points" rather than
    leave an empty frame. The legends sit under the panels, clear of every curve.

    `series[split]` holds equal-length lists "step", "loss", "accuracy" (and "lr" for train)."""
    from matplotlib.ticker import FormatStrFormatter, MaxNLocator

    fig = new_figure(11, 4.8)
    loss_ax, acc_ax = fig.subplots(1, 2, gridspec_kw={"wspace": 0.4})  # room for the LR axis between them
    for split, s in series.items():
        few = len(s["step"]) < 2
        if split == "train":
            loss_ax.plot(s["step"], s["loss"], "o-" if few else "-", color="C0", label="train (mean of each log window)")
            acc_ax.plot(s["step"], s["accuracy"], "o-" if few else "-", color="C0", label="train (augmented batches)")
        else:
            loss_ax.plot(s["step"], s["loss"], "o--", ms=6, label=f"{split} (evaluation)")
            acc_ax.plot(s["step"], s["accuracy"], "o--", ms=6, label=f"{split} (evaluation)")
            for x, y in zip(s["step"], s["accuracy"], strict=True):
                if np.isfinite(y):
                    acc_ax.annotate(f"{100 * y:.1f}%", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    handles, labels = loss_ax.get_legend_handles_labels()
    train = series.get("train")
    if train and any(np.isfinite(train["lr"])):
        lr_ax = loss_ax.twinx()
        lr_ax.plot(train["step"], train["lr"], "o:" if len(train["step"]) < 2 else ":", color="grey", label="learning rate")
        lr_ax.set_ylabel("learning rate", color="grey")
        lr_ax.tick_params(axis="y", colors="grey")
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
        extra = lr_ax.get_legend_handles_labels()
        handles, labels = handles + extra[0], labels + extra[1]
    # A log axis only where the loss spans a decade (over 1.7-2.3 it labels 2.3x10^0 and little
    # else); its ticks as plain numbers (0.5, 2), never 2x10^0.
    losses = np.array([v for s in series.values() for v in s["loss"] if np.isfinite(v) and v > 0])
    wide = losses.size > 1 and losses.max() / losses.min() >= 10
    loss_ax.set(xlabel="step", ylabel="loss" + (" (log scale)" if wide else ""), yscale="log" if wide else "linear",
                title="loss")
    if wide:
        loss_ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        loss_ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    acc_ax.set(xlabel="step", ylabel=accuracy_label, title=accuracy_label)
    steps = {x for s in series.values() for x in s["step"]}
    for ax, (h, lab) in ((loss_ax, (handles, labels)), (acc_ax, acc_ax.get_legend_handles_labels())):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps: 19, 20, 21, never 19.5
        ax.legend(h, lab, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        if max((len(s["step"]) for s in series.values()), default=0) < 2:
            ax.text(0.5, 0.5, f"too few points for a curve: {len(steps)} logged step(s)\n(train.log_every sets how often)",
                    transform=ax.transAxes, ha="center", va="center", fontsize=9, color="dimgrey")
    fig.suptitle(title or "learning curve", fontsize=10)
    return save_figure(fig, path)


def plot_confusion(counts: Sequence[Sequence[int]], class_names: Sequence[str], path, title: str = "") -> Path:
    """The confusion matrix of `counts[true][predicted]`, each row normalised to sum to 1,
    with a colour bar; class names on both axes up to 40 classes, values in the cells up to 20."""
    m = np.asarray(counts, dtype=np.float64)
    matrix = m / np.maximum(m.sum(1, keepdims=True), 1)
    k = len(class_names)
    size = min(4 + 0.35 * k, 20)
    fig = new_figure(size + 1.2, size)
    ax = fig.subplots()
    im = ax.imshow(matrix, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of the true class's images")
    if k <= 40:
        ax.set_xticks(range(k), class_names, rotation=90, fontsize=8)
        ax.set_yticks(range(k), class_names, fontsize=8)
        if k <= 20:
            for i in range(k):
                for j in range(k):
                    if matrix[i, j] >= 0.01:
                        color = "white" if matrix[i, j] > 0.5 else "black"
                        ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=8, color=color)
    heading = f"confusion matrix{f' ({title})' if title else ''}: {int(m.sum()):,} images, rows sum to 1"
    ax.set(xlabel="predicted class", ylabel="true class", title=heading)
    return save_figure(fig, path)


def plot_reliability(reliability: dict, path, ece: float, title: str = "") -> Path:
    """The reliability diagram of `vitlab.eval.calibration.calibration_metrics`: per
    confidence bin, the accuracy (bars) against the diagonal a calibrated model would follow,
    the gap shaded, and beneath it how many images fall in each bin."""
    edges = np.asarray(reliability["bin_edges"])
    width, left = np.diff(edges), edges[:-1]
    acc = np.array([np.nan if a is None else a for a in reliability["accuracy"]])
    conf = np.array([np.nan if c is None else c for c in reliability["confidence"]])
    count = np.asarray(reliability["count"])
    fig = new_figure(5.5, 6.5)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.bar(left, np.nan_to_num(acc), width=width, align="edge", edgecolor="black", color="tab:blue", label="accuracy")
    low, gap = np.nan_to_num(np.minimum(acc, conf)), np.nan_to_num(np.abs(conf - acc))
    top.bar(left, gap, bottom=low, width=width, align="edge", fill=False, edgecolor="tab:red", hatch="//",
            linewidth=0.8, label="gap to the mean confidence")
    top.plot([0, 1], [0, 1], "k--", linewidth=1, label="calibrated")
    top.set(ylim=(0, 1), ylabel="accuracy in the bin",
            title=f"reliability{f' ({title})' if title else ''}: ECE {ece:.2%}")
    top.legend(loc="upper left", fontsize=8)
    bottom.bar(left, count, width=width, align="edge", edgecolor="black", color="grey")
    bottom.set(xlim=(0, 1), xlabel="confidence (top softmax probability)", ylabel="images")
    return save_figure(fig, path)
