"""ImageNet ReaL accuracy (Beyer et al. 2020, "Are we done with ImageNet?"; a column of the
paper's Tables 2, 5 and 6).

The reassessed labels are one JSON list with one list of class ids per validation image, in
file-name order (vitlab.data's `imagenet-val:DIR` yields the images in that order). A
prediction counts as correct when it is in its image's list; an image whose list is empty
has no valid label and is left out of both the hits and the count:

    ReaL = #{i : labels_i non-empty and pred_i in labels_i} / #{i : labels_i non-empty}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from vitlab.data import DataError
from vitlab.files.documents import Number, read_json


def read_real_labels(path: str | Path, num_images: int, num_classes: int) -> list[list[int]]:
    """The published real.json: checked to hold one list of class ids per image."""
    path = Path(path)
    ids = Number(0, num_classes - 1, integer=True)
    labels = read_json(path, [[ids]], "ReaL label file (a list with one list of class ids per validation image)",
                       "give the ReaL labels (real.json)", lambda m: DataError(f"--real {m}"))
    if len(labels) != num_images:
        raise DataError(f"--real {path}: {len(labels)} label lists for {num_images} images; ReaL has one per validation "
                        "image, in file-name order (imagenet-val:DIR with all 50,000 images)")
    return labels


def real_accuracy(predictions: Sequence[int], labels: Sequence[Sequence[int]]) -> dict[str, Any]:
    """ReaL top-1 of `predictions` (one class id per image, in file-name order)."""
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} ReaL label lists")
    scored = [(p, set(x)) for p, x in zip(predictions, labels, strict=True) if x]
    hits = sum(p in x for p, x in scored)
    return {"real_top1": hits / len(scored) if scored else None, "real_count": len(scored),
            "real_left_out": len(labels) - len(scored)}


def real_line(metrics: dict[str, Any]) -> str:
    """One line for the report: ReaL beside ordinary top-1."""
    real = metrics["real_top1"]
    value = "-" if real is None else f"{real:.2%}"
    return (f"ReaL top-1 {value}   (ordinary top-1 {metrics['top1']:.2%}; {metrics['real_count']:,} images with a ReaL "
            f"label, {metrics['real_left_out']} left out)")
