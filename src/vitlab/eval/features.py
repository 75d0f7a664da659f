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

import hashlib
import json
from typing import Any, Callable, Iterable, Optional

import numpy as np
import torch

from vitlab.data import foreign
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
) -> tuple[np.ndarray, np.ndarray]:
    """(features (N, F) float32, labels (N,) int64) for the dataset's images, in its order.

    `dataset` is any dataset (torch, torchvision, Hugging Face `datasets`, vitlab) or a
    DataLoader; raw images get the model's own preprocessing (`vitlab.transform`).
    max_per_class keeps the first that many images of each class (for a streaming dataset
    it stops reading once every class is full, given `num_classes`); limit caps the total.
    `workers` data-loader processes decode the images ahead of the model, in the same order
    (a DataLoader without batching hands the items out worker by worker, in turn, and a
    streamed set gives worker w the samples w, w + workers, ...), so the features do not
    depend on it.
    """
    model.eval()
    device = next(model.parameters()).device
    dataset = foreign.wrap(dataset, preprocessing(model))
    labels_known = _dataset_labels(dataset)
    items: Iterable
    if labels_known is not None and (max_per_class or limit):
        # Choose the indices from the labels first, so skipped images are never decoded.
        keep, taken = [], {}
        for i, y in enumerate(labels_known):
            if max_per_class and taken.get(int(y), 0) >= max_per_class:
                continue
            taken[int(y)] = taken.get(int(y), 0) + 1
            keep.append(i)
            if limit and len(keep) >= limit:
                break
        items = (dataset[i] for i in keep)
        if workers:
            items = iter(torch.utils.data.DataLoader(torch.utils.data.Subset(dataset, keep), batch_size=None,
                                                     num_workers=workers))
    elif workers:
        items = iter(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers))
    else:
        items = iterate(dataset)

    feats, labels, xs, ys = [], [], [], []
    counts: dict[int, int] = {}

    def flush() -> None:
        x = torch.stack(xs).to(device)
        f = model.forward_head(model.forward_features(x), pre_logits=True)
        feats.append(f.float().cpu().numpy())
        labels.extend(ys)
        xs.clear()
        ys.clear()
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
        xs.append(x)
        ys.append(y)
        if len(xs) == batch_size:
            flush()
        if limit and len(labels) + len(xs) >= limit:
            break
        if num_classes and max_per_class and full >= num_classes:
            break  # a stream: every class is full, stop reading
    if xs:
        flush()
    if not labels:
        raise ValueError("the dataset yielded no images")
    return np.concatenate(feats).astype(np.float32), np.asarray(labels, dtype=np.int64)


def cache_key(model_hash: str, **spec: Any) -> str:
    payload = json.dumps({"model": model_hash, "representation": "pre_logits", **spec}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


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
    key = cache_key(model_hash or model_fingerprint(model), **spec, **keyed)
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
