"""Classification accuracy: top-1, top-5, loss, per-class accuracy and the confusion matrix;
`evaluate` adds precision, recall, F1 and calibration (eval/calibration.py).

Counts are kept as sums (not means) so that batches, and processes under torchrun, can be
added before dividing: `batch_counts` per batch, add them up, `metrics_from_counts` at the end.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from vitlab.data import DataError, DataOptions, foreign, known_length, make_loader, open_dataset
from vitlab.data.transforms import model_transform
from vitlab.eval.calibration import calibration_counts, calibration_metrics, class_metrics
from vitlab.eval.classes import class_names_for, only_numbers
from vitlab.eval.real import read_real_labels, real_accuracy
from vitlab.files import atomic_write_text


def batch_counts(logits: Tensor, labels: Tensor, num_classes: int) -> dict[str, Tensor]:
    """Summable statistics of one batch: loss sum, top-1/top-5 hits, count, confusion (K, K)."""
    labels = labels.to(logits.device)
    k = min(5, logits.shape[-1])
    topk = logits.topk(k, dim=-1).indices  # (B, k)
    hits = topk == labels[:, None]
    pred = topk[:, 0]
    # confusion[i, j]: images of class i predicted as j.
    confusion = torch.bincount(labels * num_classes + pred, minlength=num_classes * num_classes)
    return {
        "loss": F.cross_entropy(logits, labels, reduction="sum").double(),
        "correct1": hits[:, 0].sum().double(),
        "correct5": hits.any(-1).sum().double(),
        "count": torch.tensor(float(labels.numel()), dtype=torch.float64, device=logits.device),
        "confusion": confusion.reshape(num_classes, num_classes).double(),
    }


def add_counts(total: Optional[dict[str, Tensor]], new: dict[str, Tensor]) -> dict[str, Tensor]:
    if total is None:
        return {k: v.detach().clone() for k, v in new.items()}
    for k, v in new.items():
        total[k] += v
    return total


def metrics_from_counts(sums: dict[str, Tensor]) -> dict[str, Any]:
    count = max(float(sums["count"]), 1.0)
    confusion = sums["confusion"].cpu()
    per_class_total = confusion.sum(1)
    per_class = (confusion.diagonal() / per_class_total.clamp(min=1)).tolist()
    return {
        "loss": float(sums["loss"]) / count,
        "top1": float(sums["correct1"]) / count,
        "top5": float(sums["correct5"]) / count,
        "count": int(count),
        "per_class": [a if n > 0 else None for a, n in zip(per_class, per_class_total.tolist(), strict=True)],
        "confusion": confusion.long().tolist(),
    }


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    data: Any,
    num_classes: Optional[int] = None,
    device: str | torch.device = "cpu",
    autocast_dtype: Optional[torch.dtype] = None,
    batch_size: int = 128,
    keep_predictions: bool = False,
    keep_probabilities: bool = False,
) -> dict[str, Any]:
    """Top-1/top-5/loss/per-class/confusion, precision/recall/F1 (macro and per class) and
    calibration (ECE, MCE, the reliability bins) of `model` on `data`: any dataset (torch,
    torchvision, Hugging Face `datasets`, vitlab), a DataLoader, or an iterable of
    (images, labels, ...) batches. Raw images get the model's own preprocessing
    (`vitlab.transform`); `num_classes` defaults to the model's. `keep_predictions` adds
    "predictions": each image's top-1 class, in the data's order (for ImageNet ReaL);
    `keep_probabilities` adds "probabilities": each image's softmax over the classes."""
    device = torch.device(device)
    if not num_classes:  # (read only then: any classifier evaluates with num_classes given)
        config: Any = model.config  # a vitlab model's, or its inference copy's
        num_classes = int(config.num_classes)
    was_training = model.training
    model.eval()
    total, predictions, probabilities = None, [], []
    try:
        for images, labels in foreign.batches(data, preprocessing(model), batch_size):
            images, labels = images.to(device), labels.to(device)
            with torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
                logits = model(images)
            counts = {**batch_counts(logits.float(), labels, num_classes), **calibration_counts(logits, labels)}
            total = add_counts(total, counts)
            if keep_predictions:
                predictions += logits.argmax(-1).tolist()
            if keep_probabilities:
                probabilities += logits.float().softmax(-1).tolist()
    finally:
        model.train(was_training)
    if total is None:
        raise ValueError("the evaluation data is empty")
    metrics = metrics_from_counts(total)
    metrics.update(class_metrics(metrics["confusion"]), **calibration_metrics(total))
    if keep_probabilities:
        metrics["probabilities"] = probabilities
    return {**metrics, "predictions": predictions} if keep_predictions else metrics


def evaluate_dataset(model: torch.nn.Module, spec: str, split: str = "test", *, batch_size: int = 256,
                     workers: int = 0, skip_bad_images: bool = False, device: str | torch.device = "cpu",
                     autocast_dtype: Optional[torch.dtype] = None, progress: Optional[Callable] = None,
                     real: Optional[str] = None, probabilities: bool = False) -> tuple[dict[str, Any], list[str]]:
    """(metrics, class names) of a classifier on a dataset spec's split (`vitlab eval`): the
    images through the model's own preprocessing (`model_transform`), the results labelled
    with the checkpoint's class names (`class_names_for`). `metrics` has evaluate's keys and
    `bad_images_skipped`. `progress(total, desc)` makes a bar with .update(n) (a context manager).
    `real`: ImageNet ReaL labels (real.json) scored beside top-1 (eval/real.py).
    `probabilities`: also each image's softmax ("probabilities") and its file ("images", where
    the dataset reads files; else its position), in the data's order."""
    cfg: Any = model.config  # a vitlab model's, or its inference copy's
    if real and skip_bad_images:
        raise DataError("--real pairs each image with its line of the labels: fix unreadable images, do not skip them")
    if not cfg.num_classes:
        raise DataError(f"{cfg.name} has no classification head; evaluate it with vitlab fewshot or linear-probe")
    dataset = open_dataset(spec, split, model_transform(cfg), options=DataOptions(skip_bad_images=skip_bad_images))
    data_names = list(dataset.class_names)
    if len(data_names) != cfg.num_classes and not (only_numbers(data_names) and len(data_names) < cfg.num_classes):
        raise DataError(f"the checkpoint predicts {cfg.num_classes} classes but {spec} has {len(data_names)}; "
                        "fine-tune it first (vitlab finetune) or pick the dataset it was trained on")
    names = class_names_for(getattr(model, "class_names", None), cfg.num_classes, data_names, spec)
    loader = make_loader(dataset, batch_size, train=False, num_workers=workers)
    bad = 0

    def batches(bar):
        nonlocal bad
        for images, labels, skipped in loader:
            bad += len(skipped)  # one evaluation pass: each file once
            if bar is not None:
                bar.update(len(labels) + len(skipped))
            if labels.numel():
                yield images, labels

    with (progress(known_length(dataset), f"eval {split}") if progress else contextlib.nullcontext()) as bar:
        metrics = evaluate(model, batches(bar), cfg.num_classes, device, autocast_dtype, keep_predictions=bool(real),
                           keep_probabilities=probabilities)
    if real:
        metrics.update(real_accuracy(metrics.pop("predictions"), read_real_labels(real, len(dataset), cfg.num_classes)))
    metrics["bad_images_skipped"] = bad
    if probabilities:
        metrics["images"] = item_names(dataset, len(metrics["probabilities"]))
    return metrics, names


def item_names(dataset, count: int) -> list[Any]:
    """The file of each item of a dataset that reads files (imagefolder), else its position."""
    files, indices = getattr(dataset, "files", None), getattr(dataset, "indices", None)
    if files is not None and indices is not None and len(indices) == count:
        return [str(files[j]) for j in indices]
    return list(range(count))


def preprocessing(model: torch.nn.Module):
    """The model's eval transform, for data that arrives as raw images."""
    config = getattr(model, "config", None)
    if config is None:
        def refuse(image):
            raise ValueError(f"{type(model).__name__} has no config to preprocess raw images with; give float tensors")

        return refuse
    return model_transform(config)


def report(metrics: dict[str, Any], class_names: list[str]) -> str:
    """A plain-text table: overall top-1/top-5/loss, macro precision/recall/F1 and ECE when
    measured, then each class's accuracy (= its recall) and, when measured, precision and F1."""
    lines = [
        f"top-1 {metrics['top1']:.2%}   top-5 {metrics['top5']:.2%}   loss {metrics['loss']:.4f}   "
        f"({metrics['count']:,} images)",
    ]
    detailed = "per_class_precision" in metrics
    if detailed:
        lines.append(f"macro precision {metrics['precision']:.2%}   recall {metrics['recall']:.2%}   "
                     f"F1 {metrics['f1']:.2%}   ECE {metrics['ece']:.2%} ({len(metrics['reliability']['count'])} bins)")
    lines += ["", f"{'class':<24} {'accuracy':>9}" + (f" {'precision':>9} {'F1':>7}" if detailed else "") + f" {'images':>7}"]
    totals = [sum(row) for row in metrics["confusion"]]

    def pct(v: Optional[float], width: int) -> str:
        return f"{'-' if v is None else f'{v:.2%}':>{width}}"

    for k, (name, acc, n) in enumerate(zip(class_names, metrics["per_class"], totals, strict=True)):
        extra = f" {pct(metrics['per_class_precision'][k], 9)} {pct(metrics['per_class_f1'][k], 7)}" if detailed else ""
        lines.append(f"{name[:24]:<24} {pct(acc, 9)}{extra} {n:>7}")
    return "\n".join(lines)


def to_json(metrics: dict[str, Any], class_names: list[str]) -> str:
    out = dict(metrics)
    for key in ("per_class", "per_class_precision", "per_class_recall", "per_class_f1"):
        if key in metrics:
            out[key] = dict(zip(class_names, metrics[key], strict=True))
    out["class_names"] = class_names
    return json.dumps(out, indent=2)


def write_predictions(path: str, images: list, probabilities: list, names: list[str]) -> None:
    """One CSV row per image: the image (its file, or its position), its top-1 class and the
    probability of every class."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["image", "predicted", *names])
    for image, probs in zip(images, probabilities, strict=True):
        writer.writerow([image, names[max(range(len(probs)), key=probs.__getitem__)], *(f"{p:.8g}" for p in probs)])
    atomic_write_text(path, buffer.getvalue())
