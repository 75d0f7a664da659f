"""Drawing the analyses (Figures 6 and 7) and the training and evaluation figures (learning
curve, confusion matrix). The only module of vitlab that imports matplotlib.

Each function takes the numbers the analysis functions return and writes one PNG. Figures
are built with matplotlib's object API (no pyplot), so nothing global changes and no
display is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np


def new_figure(width: float, height: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("drawing figures needs matplotlib: pip install 'vitlab[plots]'") from None
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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
            ax.set_title(f"{100 * explained[i]:.1f}%", fontsize=6, pad=1)
    fig.suptitle(f"RGB embedding filters (first {k} principal components)\n{source}", fontsize=8)
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
    fig = new_figure(size + 1.0, size)
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(big, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks([(j * (gw + pad)) + gw / 2 - 0.5 for j in range(gw)], [str(j + 1) for j in range(gw)], fontsize=6)
    ax.set_yticks([(i * (gh + pad)) + gh / 2 - 0.5 for i in range(gh)], [str(i + 1) for i in range(gh)], fontsize=6)
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="Cosine similarity")
    return save_figure(fig, path)


def plot_attention_distance(distances: np.ndarray, path, pixels: Optional[int] = None) -> Path:
    """Fig. 7 (right): mean attention distance per head against network depth."""
    layers, heads = distances.shape
    fig = new_figure(4.5, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(1, layers + 1)
    for h in range(heads):
        ax.scatter(x, distances[:, h], s=12, label=f"Head {h + 1}")
    ax.plot(x, distances.mean(1), color="black", linewidth=1, alpha=0.6, label="mean")
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_xticks(x)
    if heads <= 16:
        ax.legend(fontsize=5, ncol=2, loc="lower right")
    ax.set_title("Mean attention distance" + (f" ({pixels} px patches)" if pixels else ""), fontsize=9)
    return save_figure(fig, path)


def plot_rollout(images: np.ndarray, maps: np.ndarray, path, titles: Optional[Sequence[str]] = None) -> Path:
    """Fig. 6: each input next to the image weighted by its upsampled rollout map.

    images: (R, H, W, C) in [0, 1]; maps: (R, H, W) in [0, 1].
    """
    r = len(images)
    cols = min(r, 4)
    rows = -(-r // cols)
    fig = new_figure(cols * 2.4, rows * 1.35 + 0.3)
    for i in range(r):
        img = images[i]
        if img.shape[-1] == 1:
            img = np.repeat(img, 3, -1)
        for k, shown in enumerate((img, img * maps[i][..., None])):
            ax = fig.add_subplot(rows, 2 * cols, 2 * i + k + 1)
            ax.imshow(np.clip(shown, 0, 1), interpolation="nearest" if img.shape[0] < 64 else "bilinear")
            ax.set_xticks([])
            ax.set_yticks([])
            if k == 0 and titles:
                ax.set_title(titles[i], fontsize=7, pad=2)
            elif k == 1:
                ax.set_title("attention", fontsize=7, pad=2)
    fig.suptitle("Attention rollout", fontsize=9)
    return save_figure(fig, path)


def plot_overlay(image: np.ndarray, amap: np.ndarray, path, title: str = "") -> Path:
    """One image, its rollout as a heat map over it, and the image weighted by the map."""
    if image.shape[-1] == 1:
        image = np.repeat(image, 3, -1)
    fig = new_figure(6.0, 2.3)
    for k in range(3):
        ax = fig.add_subplot(1, 3, k + 1)
        ax.set_xticks([])
        ax.set_yticks([])
        if k == 0:
            ax.imshow(np.clip(image, 0, 1))
            ax.set_title(title, fontsize=7)
        elif k == 1:
            ax.imshow(np.clip(image, 0, 1))
            ax.imshow(amap, cmap="jet", alpha=0.5, vmin=0, vmax=1)
            ax.set_title("rollout", fontsize=7)
        else:
            ax.imshow(np.clip(image * amap[..., None], 0, 1))
            ax.set_title("image x rollout", fontsize=7)
    return save_figure(fig, path)


def plot_learning_curve(series: dict[str, dict[str, list]], path) -> Path:
    """Loss (log scale) and top-1 accuracy against step, one line per split.

    `series[split]` holds equal-length lists "step", "loss" and "accuracy"."""
    fig = new_figure(10, 4)
    loss_ax, acc_ax = fig.subplots(1, 2)
    for split, s in series.items():
        style = ".-" if split == "train" else "o-"  # a marker, so a one-point series shows
        loss_ax.plot(s["step"], s["loss"], style, label=split)
        acc_ax.plot(s["step"], s["accuracy"], style, label=split)
    loss_ax.set(xlabel="step", ylabel="loss", yscale="log")
    acc_ax.set(xlabel="step", ylabel="accuracy (top-1)")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    return save_figure(fig, path)


def plot_confusion(counts: Sequence[Sequence[int]], class_names: Sequence[str], path) -> Path:
    """The confusion matrix of `counts[true][predicted]`, each row normalised to sum to 1;
    names on the axes up to 40 classes, values up to 20."""
    m = np.asarray(counts, dtype=np.float64)
    matrix = m / np.maximum(m.sum(1, keepdims=True), 1)
    k = len(class_names)
    size = min(4 + 0.35 * k, 20)
    fig = new_figure(size, size)
    ax = fig.subplots()
    ax.imshow(matrix, cmap="Blues", vmin=0, vmax=1)
    if k <= 40:
        ax.set_xticks(range(k), class_names, rotation=90, fontsize=8)
        ax.set_yticks(range(k), class_names, fontsize=8)
        if k <= 20:
            for i in range(k):
                for j in range(k):
                    if matrix[i, j] >= 0.01:
                        color = "white" if matrix[i, j] > 0.5 else "black"
                        ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6, color=color)
    ax.set(xlabel="predicted", ylabel="true", title="confusion matrix (rows sum to 1)")
    return save_figure(fig, path)
