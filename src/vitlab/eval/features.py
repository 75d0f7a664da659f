"""Frozen features for the few-shot and linear-probe evaluations, extracted once and cached.

The representation is what the head reads (§4.1: the pre-logits, or the pooled token when
there is no pre-logits layer): `model.forward_head(model.forward_features(x), pre_logits=True)`.

Cache: one `.npz` per (model weights, data, split, preprocessing, caps) under
$VITLAB_CACHE/features (default ~/.cache/vitlab/features). The key hashes the model's
config and every tensor of its state dict, so the same weights read from another format
with the same config hit the same entry and any change to a weight misses it; the data
spec, split, image size, mean/std, channel count and the caps are in the key too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import torch

from vitlab.data import DataOptions, foreign, known_length, open_dataset
from vitlab.data.loader import Loader
from vitlab.data.transforms import model_transform
from vitlab.eval.accuracy import preprocessing
from vitlab.files import atomic_write, cache_dir


def model_fingerprint(model: torch.nn.Module) -> str:
    """sha256 of the model's config and weights (names, dtypes, shapes and bytes)."""
    h = hashlib.sha256()
    config = getattr(model, "config", None)
    if config is not None:
        h.update(config.to_json().encode())
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def iterate(dataset) -> Iterable:
    """Items of a map-style dataset by index, or of an iterable (streaming) one in order."""
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__getitem__"):
        return iter(dataset)
    return (dataset[i] for i in range(len(dataset)))


def _dataset_labels(dataset) -> Optional[np.ndarray]:
    for name in ("labels", "targets"):
        labels = getattr(dataset, name, None)
        if labels is not None:
            try:
                return np.asarray(labels, dtype=np.int64)
            except (TypeError, ValueError):
                return None
    return None


def chosen(labels: Iterable[Any], max_per_class: Optional[int], limit: Optional[int]) -> list[int]:
    """The positions extract_features reads: the first `max_per_class` of each class, at most `limit` in all."""
    keep: list[int] = []
    taken: dict[int, int] = {}
    for i, y in enumerate(labels):
        if max_per_class and taken.get(int(y), 0) >= max_per_class:
            continue
        taken[int(y)] = taken.get(int(y), 0) + 1
        keep.append(i)
        if limit and len(keep) >= limit:
            break
    return keep


@torch.no_grad()
def extract_features(
    model: torch.nn.Module,
    dataset,
    *,
    batch_size: int = 128,
    max_per_class: Optional[int] = None,
    limit: Optional[int] = None,
    num_classes: Optional[int] = None,
    progress: Optional[Callable[[int], None]] = None,
    workers: int = 0,
    transform: Optional[Callable] = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(features (N, F) float32, labels (N,) int64) for the dataset's images, in its order.

    `dataset` is any dataset (torch, torchvision, Hugging Face `datasets`, vitlab) or a
    DataLoader; raw images get `transform`, by default the model's own preprocessing
    (`vitlab.transform`).
    max_per_class keeps the first that many images of each class (for a streaming dataset
    it stops reading once every class is full, given `num_classes`); limit caps the total.
    `workers` data-loader processes decode the images ahead of the model, in the same order
    (a DataLoader without batching hands the items out worker by worker, in turn, and a
    streamed set gives worker w the samples w, w + workers, ...), so the features do not
    depend on it.
    """
    model.eval()
    device = next(model.parameters()).device
    dataset = foreign.wrap(dataset, transform or preprocessing(model))
    labels_known, source = _dataset_labels(dataset), dataset
    if labels_known is not None and (max_per_class or limit):  # from the labels first: skipped images are never decoded
        source = torch.utils.data.Subset(dataset, chosen(labels_known, max_per_class, limit))
    items = iter(Loader(source, batch_size=None, num_workers=workers)) if workers else iterate(source)

    feats: list[np.ndarray] = []
    labels: list[Any] = []
    batch: list[tuple[torch.Tensor, int]] = []
    counts: dict[int, int] = {}

    def flush() -> None:
        x = torch.stack([x for x, _ in batch]).to(device)
        net: Any = model  # a vitlab model (forward_features, forward_head); eval knows no model class
        f = net.forward_head(net.forward_features(x), pre_logits=True)
        feats.append(f.float().cpu().numpy())
        labels.extend(y for _, y in batch)
        batch.clear()
        if progress:
            progress(len(labels))

    full = 0  # classes that reached max_per_class
    for x, y in items:
        y = int(y)
        if max_per_class:
            if counts.get(y, 0) >= max_per_class:
                continue
            counts[y] = counts.get(y, 0) + 1
            full += counts[y] == max_per_class
        batch.append((x, y))
        if len(batch) == batch_size:
            flush()
        if limit and len(labels) + len(batch) >= limit:
            break
        if num_classes and max_per_class and full >= num_classes:
            break  # a stream: every class is full, stop reading
    if batch:
        flush()
    if not labels:
        raise ValueError("the dataset yielded no images")
    return np.concatenate(feats).astype(np.float32), np.asarray(labels, dtype=np.int64)


def cached_features(
    model: torch.nn.Module,
    dataset,
    spec: dict[str, Any],
    *,
    use_cache: bool = True,
    model_hash: Optional[str] = None,
    log: Optional[Callable[[str], None]] = None,
    **kwargs: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """`extract_features` through the on-disk cache. `spec` names the data and the
    preprocessing (data spec, split, image size, mean, std, channels); kwargs are passed to
    `extract_features` and are part of the key where they change the result."""
    keyed = {k: kwargs.get(k) for k in ("max_per_class", "limit")}
    payload = {"model": model_hash or model_fingerprint(model), "representation": "pre_logits", **spec, **keyed}
    key = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]
    path = cache_dir("features") / f"{key}.npz"
    if use_cache and path.exists():
        try:
            with np.load(path) as z:
                if log:
                    log(f"features from cache {path}")
                return z["features"], z["labels"]
        except (OSError, ValueError, KeyError):
            pass  # a damaged entry is recomputed and replaced
    feats, labels = extract_features(model, dataset, **kwargs)
    if use_cache:
        described = json.dumps({**spec, **keyed}, default=str)

        def save(tmp: str) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a name
                np.savez(f, features=feats, labels=labels, spec=described)

        atomic_write(path, save)
        if log:
            log(f"features cached in {path}")
    return feats, labels


def feature_key(spec: str, split: str, config) -> dict[str, Any]:
    """What, besides the weights, decides the features: the data and the preprocessing."""
    return {
        "data": spec,
        "split": split,
        "image_size": list(config.image_size),
        "in_channels": config.in_channels,
        "mean": list(config.mean),
        "std": list(config.std),
        "crop": [config.crop_fraction, config.crop_mode, config.interpolation],
        **({} if config.resize_backend == "pil" else {"resize_backend": config.resize_backend}),
    }


def open_for_model(spec: str, split: str, config, class_names: Optional[Sequence[str]] = None):
    """A dataset with the model's preprocessing (`model_transform`). WebDataset shards carry
    class indices only; without a classes.txt beside them the checkpoint's class names (when
    it has one per class) name them."""
    options = DataOptions()
    if spec.lower().startswith("wds:") and class_names and len(class_names) == config.num_classes:
        shards = Path(spec[4:]).expanduser()
        if not (shards.is_dir() and (shards / "classes.txt").is_file()):
            options = DataOptions(classes=tuple(class_names))
    return open_dataset(spec, split, model_transform(config), options=options)


def dataset_features(model: torch.nn.Module, spec: str, split: str, *, max_per_class: Optional[int] = None,
                     limit: Optional[int] = None, batch_size: int = 128, use_cache: bool = True,
                     model_hash: Optional[str] = None, log: Optional[Callable[[str], None]] = None,
                     progress: Optional[Callable] = None, workers: int = 0,
                     preprocessing=None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(features, labels, class names) of a dataset spec's split through the model's own
    preprocessing (or `preprocessing`, a config with other crop fields) and the feature cache:
    what `vitlab fewshot` and `vitlab linear-probe` read. `progress(total, desc)` makes a bar
    with .update(n) (a context manager); `workers` data-loader processes decode the images
    (the same features, see extract_features)."""
    config = preprocessing or model.config
    dataset = open_for_model(spec, split, config, getattr(model, "class_names", None))
    names = list(getattr(dataset, "class_names", None) or [])
    total = expected_count(dataset, max_per_class, len(names) or None, limit)
    with (progress(total, f"features {split}") if progress else contextlib.nullcontext()) as bar:
        seen = [0]

        def counted(n: int) -> None:
            if bar is not None:
                bar.update(n - seen[0])
            seen[0] = n

        features, labels = cached_features(
            model, dataset, feature_key(spec, split, config), use_cache=use_cache, model_hash=model_hash,
            log=log, batch_size=batch_size, max_per_class=max_per_class or None, limit=limit or None,
            num_classes=len(names) or None, progress=counted, workers=workers)
    return features, labels, names


def expected_count(dataset, max_per_class: Optional[int], num_classes: Optional[int], limit: Optional[int]) -> Optional[int]:
    """How many images an extraction will read, where that is known beforehand."""
    caps = [c for c in (known_length(dataset), limit or None, max_per_class * num_classes if max_per_class and num_classes else None) if c]
    return min(caps) if caps else None
