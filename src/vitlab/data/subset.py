"""A fixed, class-balanced part of a training set: the miniature of the paper's random JFT
subsets of 9M, 30M and 90M images (§4.3, Fig. 4).

The part is a function of the dataset's labels, its size and a seed, nothing else: every
run, every `train.seed` and every process count trains on the same images. Each class
contributes equally (its share differs from another's by one image at most, unless a class
has too few images, which then gives all it has); within a class the images are the first
of a seeded permutation, so a smaller part is always inside a larger one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vitlab.data.datasets import DataError
from vitlab.data.wds import WebDataset


def class_quotas(counts: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Images to take from each class: as equal as the counts allow, summing to `size`. The
    classes that get one image more than the others are a seeded choice."""
    quotas = np.zeros(len(counts), dtype=np.int64)
    left = size
    while left > 0:
        open_ = np.flatnonzero(quotas < counts)
        if len(open_) == 0:
            break
        share = left // len(open_)
        if share == 0:  # fewer images left than open classes: one each to a seeded choice
            order = np.random.default_rng([seed, 1]).permutation(len(counts))
            chosen = [c for c in order if quotas[c] < counts[c]][:left]
            quotas[chosen] += 1
            break
        add = np.minimum(share, counts[open_] - quotas[open_])
        quotas[open_] += add
        left -= int(add.sum())
    return quotas


def balanced_indices(labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Positions (sorted) of a class-balanced subset of `size` items of `labels`."""
    labels = np.asarray(labels, dtype=np.int64)
    classes, counts = np.unique(labels, return_counts=True)
    quotas = class_quotas(counts, size, seed)
    chosen = []
    for c, q in zip(classes, quotas, strict=True):
        members = np.flatnonzero(labels == c)
        order = np.random.default_rng([seed, 0, int(c)]).permutation(len(members))
        chosen.append(members[order[:q]])
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def training_subset(dataset: Any, fraction: float = 1.0, size: int = 0, seed: int = 0) -> Any:
    """The dataset restricted to `size` images (or `fraction` of it), class-balanced and
    fixed by `seed`; the dataset itself when that is all of it."""
    total = len(dataset)
    n = size or int(round(fraction * total))
    if n > total:
        raise DataError(f"data.train_size={n} exceeds the {total} images of the training split; lower it")
    if n < 1:
        raise DataError(f"data.train_fraction={fraction:g} of {total} images leaves none; raise it")
    if n == total:
        return dataset
    if isinstance(dataset, WebDataset):
        keys, labels = dataset.keys_and_labels()
        return dataset.restrict({keys[i] for i in balanced_indices(np.asarray(labels), n, seed)})
    return dataset.select(balanced_indices(dataset.labels, n, seed))
