"""Precision, recall and F1 per class and macro-averaged, from the confusion matrix; and
calibration: the expected calibration error (ECE) over confidence bins, the numbers a
reliability diagram draws (analysis/plots.plot_reliability).

Like accuracy.py, everything is kept as sums, so batches and processes add up before the
division at the end: `calibration_counts` per batch (with add_counts), `calibration_metrics`
at the end.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

BINS = 15  # equal-width confidence bins, as Guo et al. 2017 ("On calibration of modern neural networks")


def class_metrics(confusion: list[list[int]] | Tensor) -> dict[str, Any]:
    """Per class: precision = right / predicted as the class, recall = right / images of
    the class, F1 their harmonic mean; macro = the plain mean over the classes that have
    images (a class without images has no recall). A class with images that is never
    predicted has precision 0 (nothing it predicted was right, because nothing was)."""
    c = torch.as_tensor(confusion, dtype=torch.float64)
    right, predicted, actual = c.diagonal(), c.sum(0), c.sum(1)

    def scores(k: int) -> tuple[Optional[float], Optional[float], Optional[float]]:  # class k's (precision, recall, F1)
        if actual[k] == 0:
            return None if predicted[k] == 0 else 0.0, None, None
        p = float(right[k] / predicted[k]) if predicted[k] > 0 else 0.0
        r = float(right[k] / actual[k])
        return p, r, 2 * p * r / (p + r) if p + r > 0 else 0.0

    per_class = [scores(k) for k in range(c.shape[0])]
    precision, recall, f1 = ([s[i] for s in per_class] for i in range(3))
    present = [k for k in range(c.shape[0]) if actual[k] > 0]

    def macro(values: list[Optional[float]]) -> float:
        return sum(values[k] or 0.0 for k in present) / max(len(present), 1)

    return {"precision": macro(precision), "recall": macro(recall), "f1": macro(f1),
            "per_class_precision": precision, "per_class_recall": recall, "per_class_f1": f1}


def calibration_counts(logits: Tensor, labels: Tensor, bins: int = BINS) -> dict[str, Tensor]:
    """Summable sums of one batch: per confidence bin (the top softmax probability), the
    number of images, the sum of their confidences and the number right."""
    probs = logits.float().softmax(-1)
    confidence, pred = probs.max(-1)  # (B,)
    right = (pred == labels.to(pred.device)).double()
    index = (confidence * bins).long().clamp(max=bins - 1)  # bin b holds (b/bins, (b+1)/bins]
    return {
        "calib_count": torch.bincount(index, minlength=bins).double(),
        "calib_confidence": torch.bincount(index, weights=confidence.double(), minlength=bins),
        "calib_right": torch.bincount(index, weights=right, minlength=bins),
    }


def calibration_metrics(sums: dict[str, Tensor]) -> dict[str, Any]:
    """ECE = sum over bins of (images in the bin / all images) x |accuracy - mean confidence|,
    the maximum calibration error (the worst bin), and the bins themselves."""
    n, conf, right = (sums[k].cpu().double() for k in ("calib_count", "calib_confidence", "calib_right"))
    total = max(float(n.sum()), 1.0)
    filled = n > 0
    acc = torch.where(filled, right / n.clamp(min=1), torch.zeros_like(n))
    mean_conf = torch.where(filled, conf / n.clamp(min=1), torch.zeros_like(n))
    gap = (acc - mean_conf).abs()
    bins = n.numel()
    return {
        "ece": float((n / total * gap).sum()),
        "mce": float(gap[filled].max()) if filled.any() else 0.0,
        "reliability": {
            "bin_edges": [b / bins for b in range(bins + 1)],
            "count": n.long().tolist(),
            "accuracy": [float(a) if f else None for a, f in zip(acc, filled, strict=True)],
            "confidence": [float(c) if f else None for c, f in zip(mean_conf, filled, strict=True)],
        },
    }
