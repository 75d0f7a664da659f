"""Fig. 7 (centre): cosine similarity between position embeddings (§4.5, App. D.4).

For each patch position, the similarity of its embedding to every other position's: with
learned 1D embeddings the paper sees nearby patches get similar embeddings, and row/column
structure appears. The class token's embedding is left out (it has no place on the grid).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor


class NoPositionTable(ValueError):
    """The model adds no absolute position embedding ("none" or "relative", App. D.4)."""


def position_table(model, grid: Optional[tuple[int, int]] = None) -> Tensor:
    """The (gh*gw, D) embeddings added to the patch tokens, in raster order.

    Works for learned 1D, learned 2D (row and column halves concatenated, as the model adds
    them) and fixed 2D sin-cos. "none" and "relative" have no such table: raises
    NoPositionTable with a message that says why.
    """
    pe = model.pos_embed
    if pe.kind in ("none", "relative"):
        what = "no position embedding" if pe.kind == "none" else "relative position attention (App. D.4)"
        raise NoPositionTable(
            f"pos_embed={pe.kind!r}: the model uses {what}, so there is no table of absolute "
            "position embeddings to compare"
        )
    with torch.no_grad():
        return pe.patch_table(tuple(grid or pe.grid))[0].detach().float().cpu()


def cosine_similarity_grid(table: Tensor, grid: tuple[int, int]) -> np.ndarray:
    """(gh, gw, gh, gw): entry [i, j, k, l] is cos(E_pos[i, j], E_pos[k, l])."""
    gh, gw = grid
    if table.shape[0] != gh * gw:
        raise ValueError(f"table has {table.shape[0]} rows, the grid {gh}x{gw} needs {gh * gw}")
    t = table.double()
    t = t / t.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return (t @ t.T).reshape(gh, gw, gh, gw).float().numpy()


def similarity_vs_distance(sim: np.ndarray) -> dict:
    """Summaries that test the paper's observation "closer patches have more similar
    position embeddings": mean similarity per grid distance (rounded to 0.5 cells) and the
    Pearson correlation between distance and similarity over all pairs of distinct positions
    (negative: nearer means more similar)."""
    gh, gw = sim.shape[:2]
    ys, xs = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    pos = np.stack([ys.ravel(), xs.ravel()], 1).astype(np.float64)
    dist = np.sqrt(((pos[:, None] - pos[None]) ** 2).sum(-1))
    s = sim.reshape(gh * gw, gh * gw).astype(np.float64)
    off = ~np.eye(gh * gw, dtype=bool)
    d, v = dist[off], s[off]
    corr = float(np.corrcoef(d, v)[0, 1]) if d.size > 1 and v.std() > 0 else float("nan")
    bins = np.round(d * 2) / 2
    levels = np.unique(bins)
    by = [float(v[bins == b].mean()) for b in levels]
    nearest = v[d <= 1.0 + 1e-9]
    farthest = v[d >= d.max() * 0.75]
    return {
        "distance": levels.tolist(),
        "mean_similarity": by,
        "pearson_distance_similarity": corr,
        "mean_similarity_neighbours": float(nearest.mean()) if nearest.size else float("nan"),
        "mean_similarity_far": float(farthest.mean()) if farthest.size else float("nan"),
    }
