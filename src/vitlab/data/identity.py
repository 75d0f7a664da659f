"""Which of the paper's datasets a training set is: from its declared name or its contents,
never from the words in its path.

The paper holds out a dev split to choose the fine-tuning learning rate (Appendix B.1.1):
2% of CIFAR, 1% of ImageNet, 10% of the other sets. How much is held out therefore depends
on what the data is. It is told, in this order:

1. an explicit `data.dev_fraction` (or `dev_fraction=` to open_dataset);
2. the spec's declared kind: `cifar10[:DIR]` and `cifar100[:DIR]` are CIFAR by name (and
   `vitlab finetune --table4 DATASET` declares a Table 4 row);
3. the contents: a training split whose size and class counts are those of a known set
   (CIFAR-10: 50,000 images, 10 classes of 5,000) is that set, whatever its files are
   called or wherever they lie, so the same shards through two paths give the same split;
4. otherwise 10%.

Nothing here reads images: the class counts come from the labels (for WebDataset shards,
from the cached shard index).
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

# Appendix B.1.1's dev fractions; 10% for every set it does not name.
DEV_FRACTIONS = {"imagenet": 0.01, "cifar10": 0.02, "cifar100": 0.02, "pets": 0.1, "flowers": 0.1}
DEFAULT_DEV_FRACTION = 0.1
NAMED = {"cifar10": "cifar10", "cifar100": "cifar100"}  # dataset specs that declare a paper dataset

# The training splits of the paper's datasets by their shape: (images, classes, images in
# every class, or None where the classes differ in size).
KNOWN_SHAPES = {
    "cifar10": (50_000, 10, 5_000),
    "cifar100": (50_000, 100, 500),
    "imagenet": (1_281_167, 1_000, None),  # ILSVRC-2012 train
    "pets": (3_680, 37, None),  # Oxford-IIIT Pets trainval
    "flowers": (2_040, 102, 20),  # Oxford Flowers-102 train + val
}


def by_name(spec: str) -> Optional[str]:
    """The paper dataset a spec declares by its name (`cifar10:DIR` is CIFAR-10), else None.
    The path after the colon is not looked at."""
    return NAMED.get(spec.partition(":")[0].strip().lower())


def recognise(class_counts: Iterable[int]) -> Optional[str]:
    """The paper dataset whose training split has exactly these class counts (label 0, 1,
    ...; trailing empty classes ignored), else None."""
    counts = list(class_counts)
    while counts and counts[-1] == 0:
        counts.pop()
    total = sum(counts)
    for name, (size, classes, each) in KNOWN_SHAPES.items():
        if total == size and len(counts) == classes and (each is None or all(c == each for c in counts)):
            return name
    return None


def summed(counts: Iterable[Sequence[int]]) -> list[int]:
    """Class counts added up (over the shards of a split), label by label."""
    total: list[int] = []
    for part in counts:
        total += [0] * (len(part) - len(total))
        for label, n in enumerate(part):
            total[label] += n
    return total


def dev_fraction(identity: Optional[str], explicit: Optional[float] = None) -> float:
    """The share held out as the dev split: the explicit one (>= 0), else the paper's for
    the dataset, else 10%."""
    if explicit is not None and explicit >= 0:
        return float(explicit)
    return DEV_FRACTIONS.get(identity or "", DEFAULT_DEV_FRACTION)


def describe(identity: Optional[str], explicit: Optional[float] = None) -> str:
    """Why the dev split is the size it is, in a few words (for plan lines)."""
    share = dev_fraction(identity, explicit)
    if explicit is not None and explicit >= 0:
        return f"dev split {share:.0%} (data.dev_fraction)"
    if identity in DEV_FRACTIONS:
        return f"dev split {share:.0%}: the paper's for {identity} (Appendix B.1.1)"
    return f"dev split {share:.0%}: the paper's for a dataset it does not name (data.dev_fraction to change it)"
