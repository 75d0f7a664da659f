"""The `vitlab inspect` figure of a masked-patch-prediction checkpoint (§4.6).

Per image: the input, the corruption the encoder saw, the true colours of the corrupted
patches and the colours the prediction head gave them. Draws with the helpers of
`plots.py`, which owns the matplotlib import.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import Tensor

from vitlab.analysis.figure import Figure
from vitlab.analysis.mpp import MPPPredictions, head_from_extras, mpp_predictions, summary_numbers
from vitlab.analysis.plots import new_figure, save_figure

# Outline colours per corruption kind (codes of vitlab.models.mpp).
KIND_COLORS = {1: ("#d62728", "[mask]"), 2: ("#1f77b4", "random patch"), 3: ("#2ca02c", "unchanged")}
MASK_GREY = 0.5


def _expand(kind: np.ndarray, factor: int) -> np.ndarray:
    return np.kron(kind, np.ones((factor, factor), dtype=kind.dtype))


def plot_mpp(result: MPPPredictions, path, max_images: int = 4, source: str = "") -> Path:
    from matplotlib.patches import Patch, Rectangle  # optional dependency: only when drawing

    n = min(max_images, result.images.shape[0])
    h = result.images.shape[1]
    gh = result.kind.shape[1]
    p = h // gh
    fig = new_figure(4 * 1.6 + 0.3, n * 1.6 + 0.6)
    titles = ("input", "what the encoder sees", "true colour (corrupted)", "predicted colour")
    for i in range(n):
        img = result.images[i]
        if img.shape[-1] == 1:
            img = np.repeat(img, 3, axis=-1)
        selected_px = _expand(result.kind[i] != 0, p)[..., None]  # (H, W, 1)
        masked_px = _expand(result.kind[i] == 1, p)[..., None]
        seen = np.where(masked_px, MASK_GREY, img)
        faded = 0.15 * img + 0.85  # untouched patches: a pale copy of the input, for context
        panels = [img, seen]
        for colours in (result.true[i], result.predicted[i]):
            scale = h // colours.shape[0]
            full = np.kron(colours, np.ones((scale, scale, 1)))
            if full.shape[-1] == 1:
                full = np.repeat(full, 3, axis=-1)
            panels.append(np.where(selected_px, full, faded))
        for j, panel in enumerate(panels):
            ax = fig.add_subplot(n, 4, i * 4 + j + 1)
            ax.imshow(np.clip(panel, 0, 1), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(titles[j], fontsize=8)
            if j >= 1:  # outline each corrupted patch by what was done to it
                for (r, c), code in np.ndenumerate(result.kind[i]):
                    if code:
                        ax.add_patch(
                            Rectangle((c * p - 0.5, r * p - 0.5), p, p, fill=False, lw=0.6, ec=KIND_COLORS[code][0])
                        )
    handles = [Patch(facecolor="none", edgecolor=col, label=label) for col, label in KIND_COLORS.values()]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    acc = "" if result.target == "pixels" else f", colour accuracy {100 * result.accuracy:.1f}%"
    fig.suptitle(f"Masked patch prediction ({result.target}){acc}\n{source}", fontsize=8)
    return save_figure(fig, path)


def mpp_figures(model, metadata: dict[str, str], extras: dict[str, Tensor], images: Tensor, out_dir: Path) -> list:
    """The hook of `vitlab.analysis.objective_figures` for MPP checkpoints."""
    if "mask_token" not in extras:
        return []
    head = head_from_extras(model, metadata, extras)
    result = mpp_predictions(model, head, images.to(next(model.parameters()).device))
    png = plot_mpp(result, Path(out_dir) / "mpp_predictions.png", source=model.config.name)
    caption = (
        "Masked patch prediction (§4.6): half of each image's patches are corrupted (outlined: red "
        "[mask], blue a random other patch, green unchanged but still predicted); the head "
        "predicts each corrupted patch's 3-bit mean colour from the encoder's output token."
    )
    return [Figure("mpp", "Masked patch prediction", png, caption, summary_numbers(result))]


__all__ = ["mpp_figures", "plot_mpp"]
