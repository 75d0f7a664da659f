"""Extension point of `vitlab inspect`: the figures a training objective adds to the paper's four.

`vitlab inspect` calls `objective_figures(...)` after drawing Fig. 6/7 and shows every Figure
it returns on the same HTML page (and writes its numbers into the JSON). A training
objective that leaves something worth seeing in the checkpoint adds it here, keyed on the
checkpoint's metadata: e.g. masked patch prediction (§4.6) writes `objective: "mpp"` and
its head under `Imported.extras`, and can return a figure of its colour predictions.

Contract: pure of side effects except writing PNGs inside `out_dir`; return [] when there
is nothing to add; raise nothing for checkpoints that are not yours.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from vitlab.analysis.figure import Figure
from vitlab.analysis.mpp_plot import mpp_figures


def objective_figures(
    model,
    metadata: dict[str, str],
    extras: dict[str, Tensor],
    images: Tensor,
    out_dir: Path,
) -> list[Figure]:
    """Figures for checkpoints whose metadata asks for them.

    model: the loaded VisionTransformer (eval mode); metadata: the checkpoint's metadata
    (`Imported.metadata`, e.g. {"objective": "mpp", ...}); extras: objective tensors stored
    with the checkpoint (`Imported.extras`); images: the normalised (B, C, H, W) batch the
    analyses used; out_dir: where PNGs go.
    """
    if metadata.get("objective") == "mpp":  # masked patch prediction, §4.6 (analysis/mpp_plot.py)
        return mpp_figures(model, metadata, extras, images, out_dir)
    return []
