"""Run all four analyses of §4.5 on a model and a stream of image batches."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from vitlab.analysis.attention_distance import AttentionDistance, distance_depth_trend
from vitlab.analysis.filters import FilterPCs, embedding_filters
from vitlab.analysis.pos_similarity import NoPositionTable, cosine_similarity_grid, position_table, similarity_vs_distance
from vitlab.analysis.rollout import attention_rollout
from vitlab.models.mpp import unnormalise  # vitlab.pixels's, the normaliser's inverse

NO_ATTENTION = "a BiT ResNet has no attention: its receptive field grows with depth by construction"


def _rounded(a: np.ndarray, digits: int) -> list:
    # Rounded in float64: a float32 0.1234 becomes 0.12340000271797180 in JSON.
    return np.asarray(a, dtype=np.float64).round(digits).tolist()


@dataclass
class Analysis:
    filters: FilterPCs
    pos_similarity: Optional[np.ndarray]  # (gh, gw, gh, gw), None when there is no table
    pos_note: str  # what the similarity shows, or why there is none
    pos_summary: dict
    distances: np.ndarray  # (layers, heads), pixels
    prefix_fraction: np.ndarray  # (layers, heads) attention patches give the class token
    distance_summary: dict
    num_images: int
    rollout_images: Tensor  # (R, C, H, W) normalised inputs of the rollout figure
    rollout_maps: np.ndarray  # (R, gh, gw)
    rollout_labels: list = field(default_factory=list)
    grid: tuple = (0, 0)
    patch_pixels: int = 0
    distance_mode: str = "centres"
    uniform_distance: float = float("nan")  # uniform attention's value, the reference line
    attention_note: str = ""  # why there is no attention distance or rollout, when there is none
    draws: list = field(default_factory=list)  # a random-init null: each draw's seed and distance summary

    def numbers(self) -> dict:
        """Everything as JSON-ready numbers."""
        return {
            "embedding_filters": {
                "source": self.filters.source,
                "explained_variance_ratio": self.filters.explained.tolist(),
            },
            "position_similarity": {
                "note": self.pos_note,
                "grid": list(self.grid),
                "summary": self.pos_summary,
                "similarity": None if self.pos_similarity is None else _rounded(self.pos_similarity, 4),
            },
            "attention_distance": {
                "num_images": self.num_images,
                "pixels_per_patch": self.patch_pixels,
                "mode": self.distance_mode,
                "uniform": round(self.uniform_distance, 3),
                "class_token": "excluded as query and key; patch rows renormalised",
                "distance_px": _rounded(self.distances, 3),
                "attention_to_class_token": _rounded(self.prefix_fraction, 4),
                "summary": self.distance_summary,
                **({"draws": self.draws} if self.draws else {}),
            },
            "rollout": {
                "labels": self.rollout_labels,
                "maps": _rounded(self.rollout_maps, 4),
            },
        }


@torch.no_grad()
def analyse_model(
    model,
    batches: Iterable,
    max_images: int = 128,
    rollout_images: int = 8,
    num_components: int = 28,
    distance_mode: str = "centres",
) -> Analysis:
    """Filters, position similarity, attention distance over up to `max_images` images
    (the paper: 128), and the rollout of the first `rollout_images`; `num_components`
    principal components of the embedding filters (Fig. 7 shows 28). `distance_mode`:
    between patch centres (the default) or the paper's pixel pairs (attention_distance.py).

    `batches` yields image tensors (B, C, H, W), normalised as the model expects, or
    (images, labels) pairs.
    """
    model.eval()
    cfg = model.config
    filters = embedding_filters(model, num_components)
    if not model.config.has_attention:  # a BiT ResNet: of §4.5's analyses only the first filters apply
        return convolutional_analysis(filters)
    grid = cfg.grid_size
    try:
        table = position_table(model, grid)
        sim = cosine_similarity_grid(table, grid)
        pos_note = f"pos_embed={cfg.pos_embed!r}: cosine similarity of the patch position embeddings"
        pos_summary = similarity_vs_distance(sim)
    except NoPositionTable as e:
        sim, pos_note, pos_summary = None, str(e), {}

    acc: Optional[AttentionDistance] = None
    roll_x: list[Tensor] = []
    roll_maps: list[np.ndarray] = []
    roll_labels: list[Any] = []
    seen = 0
    device = next(model.parameters()).device
    for batch in batches:
        x, labels = (batch[0], batch[1]) if isinstance(batch, (tuple, list)) else (batch, None)
        x = x[: max_images - seen].to(device)
        if not len(x):
            break
        out = model(x, return_intermediates=True)
        attns, g = out["attentions"], out["grid"]
        if acc is None:
            acc = AttentionDistance(g, cfg.total_stride, model.num_prefix_tokens, distance_mode)
        acc.update(attns)
        need = rollout_images - sum(len(t) for t in roll_x)
        if need > 0:
            roll_x.append(x[:need].cpu())
            roll_maps.append(attention_rollout([a[:need] for a in attns], g, model.num_prefix_tokens))
            if labels is not None:
                roll_labels.extend(int(v) for v in labels[:need])
        seen += len(x)
        if seen >= max_images:
            break
    if acc is None:
        raise ValueError("no images to analyse: give at least one image")
    distances = acc.result()
    return Analysis(
        filters=filters,
        pos_similarity=sim,
        pos_note=pos_note,
        pos_summary=pos_summary,
        distances=distances,
        prefix_fraction=acc.prefix_fraction(),
        distance_summary=distance_depth_trend(distances),
        num_images=acc.count,
        rollout_images=torch.cat(roll_x) if roll_x else torch.empty(0),
        rollout_maps=np.concatenate(roll_maps) if roll_maps else np.empty((0,) + tuple(grid)),
        rollout_labels=roll_labels,
        grid=tuple(grid),
        patch_pixels=cfg.total_stride,
        distance_mode=distance_mode,
        uniform_distance=acc.uniform,
    )


def pooled_draws(analyses: Sequence[Analysis], seeds: Sequence[int]) -> Analysis:
    """The random-init null of one architecture, from one Analysis per seed: the first draw's
    filters, position similarity and rollout; the attention distances and attention to the class
    token averaged over the draws; each summary statistic (the most local head per layer, ...) the
    mean of that statistic over the draws, computed per draw first, so it is the null's mean of
    the statistic and not the statistic of averaged heads. Every draw's summary is kept."""
    first = analyses[0]
    if first.attention_note or len(analyses) == 1:
        return first
    summaries = [a.distance_summary for a in analyses]
    mean = {k: np.mean([s[k] for s in summaries], axis=0).tolist() for k in summaries[0]}
    return replace(first, distances=np.mean([a.distances for a in analyses], axis=0),
                   prefix_fraction=np.mean([a.prefix_fraction for a in analyses], axis=0), distance_summary=mean,
                   draws=[{"seed": int(seed), "summary": s} for seed, s in zip(seeds, summaries, strict=True)])


def convolutional_analysis(filters: FilterPCs) -> Analysis:
    """What `analyse_model` finds in a BiT ResNet: its root filters, and the reasons the
    position-embedding and attention analyses do not apply."""
    empty = np.zeros((0, 0))
    return Analysis(
        filters=filters,
        pos_similarity=None,
        pos_note="a BiT ResNet has no position embeddings: convolutions are translation-equivariant",
        pos_summary={},
        distances=empty,
        prefix_fraction=empty,
        distance_summary={"note": NO_ATTENTION},
        num_images=0,
        rollout_images=torch.empty(0),
        rollout_maps=np.empty((0, 0, 0)),
        attention_note=NO_ATTENTION,
    )


def display_images(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Undo the model's normalisation: (B, C, H, W) -> (B, H, W, C) in [0, 1] for drawing."""
    return unnormalise(x.detach().float().cpu(), mean, std).permute(0, 2, 3, 1).numpy()
