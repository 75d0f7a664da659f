"""ImageNet class names, shipped with vitlab (built by tools/build_imagenet_labels.py from
torchvision's and timm's own copies; see that script for where each list comes from).

The paper's checkpoints are ImageNet classifiers: 1000 classes after fine-tuning on
ImageNet-1k (ILSVRC-2012) or 21,843 after pre-training on ImageNet-21k (§4.1). Their files
(the official .npz, timm and torchvision state dicts) hold no class names, so a checkpoint of
one of those two class counts gets these names when it is read.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
import re
from pathlib import Path
from typing import Optional

# class count -> file in vitlab/checkpoints/class_names/
IMAGENET_FILES = {1000: "imagenet-1k.tsv", 21843: "imagenet-21k.tsv"}
# Formats whose published checkpoints are all ImageNet classifiers and that store no names:
# the official .npz files (every one of a head of 1000 or 21,843 classes is ImageNet's). A timm
# or torchvision state dict is anyone's: its head's size is not enough, its name must say so.
IMAGENET_FORMATS = ("npz",)
IMAGENET_WORDS = re.compile(r"imagenet|ilsvrc|in1k|in21k|in22k|in-1k|in-21k", re.IGNORECASE)


def says_imagenet(fmt: str, path: str | os.PathLike) -> bool:
    """A file whose class names may be ImageNet's (the head's size decides whether they are):
    an official .npz, or a timm or torchvision state dict whose name or folder says ImageNet."""
    if fmt in IMAGENET_FORMATS:
        return True
    p = Path(path)
    return fmt in ("timm", "torchvision") and bool(IMAGENET_WORDS.search(f"{p.parent.name}/{p.name}"))


@functools.lru_cache(maxsize=None)
def _read(file: str) -> tuple[tuple[str, str], ...]:
    text = (importlib.resources.files("vitlab.checkpoints") / "class_names" / file).read_text(encoding="utf-8")
    return tuple(tuple(line.split("\t", 1)) for line in text.splitlines())  # type: ignore[misc]  # each line is "id<TAB>name": pairs, which tuple() cannot say


def imagenet_names(num_classes: int) -> Optional[list[str]]:
    """The ImageNet-1k or -21k class names for a head of that size, else None."""
    file = IMAGENET_FILES.get(num_classes)
    return [name for _, name in _read(file)] if file else None


def imagenet_synsets(num_classes: int) -> Optional[list[str]]:
    """The WordNet ids ("n01440764") of the same classes, in the same order."""
    file = IMAGENET_FILES.get(num_classes)
    return [synset for synset, _ in _read(file)] if file else None


def is_imagenet(names: Optional[list[str]]) -> bool:
    return names is not None and names == imagenet_names(len(names))
