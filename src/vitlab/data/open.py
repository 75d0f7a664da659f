"""A dataset by spec and split: `open_dataset`, with its options as one typed value.

    open_dataset("cifar10:../shared/data", "train", transform, train=True, seed=0,
                 options=DataOptions(dev_fraction=0.02, skip_bad_images=True))

The spec names the source (see the package docstring for the list), the split one part of
it, the transform what each image goes through. `DataOptions` holds everything else that
decides what is read, with its defaults in one place (the data section's, where the run's
config has the setting: `DataOptions.of(cfg.data)`). A dataset opened once can be read
through another transform, seed or mode without opening it again (`view`): that is how a
fine-tune's sweep, repeats and final run share one open per split (train/inputs.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from vitlab import suggest
from vitlab.config.run import DATA_SPECS, SHUFFLE_BUFFER, DataConfig
from vitlab.data import datasets as ds, synthetic
from vitlab.data.datasets import DataError
from vitlab.data.foreign import ForeignDataset, hf_split
from vitlab.data.identity import by_name, dev_fraction, recognise
from vitlab.data.imagenet_val import imagenet_val
from vitlab.data.vtab_sources import open_vtab
from vitlab.data.wds import WebDataset

NAMED = ("digits", "fashion-mnist", "cifar10", "cifar100", "imagefolder", "imagenet-val", "vtab", "wds", "hf",
         "synthetic")
WITH_PATH = ("imagefolder", "imagenet-val", "vtab", "wds", "hf", "synthetic")  # specs that need NAME:PATH
TEST_FRACTION = 0.2  # an imagefolder without train/ and val/ sub-folders: this share held out as "test"


@dataclass(frozen=True)
class DataOptions:
    """How a spec is opened, besides its split, transform, mode and seed."""

    dev_fraction: Optional[float] = None  # the dev split's share; None: the data's paper share (identity.py)
    skip_bad_images: bool = False  # drop and count unreadable images instead of raising BadImageError
    shuffle_buffer: int = SHUFFLE_BUFFER  # samples a streamed (wds) training set holds for shuffling
    classes: tuple[str, ...] = ()  # a wds set's class names (else classes.txt beside the shards, else 0..K-1)
    test_fraction: float = TEST_FRACTION  # imagefolder without sub-folders: the share held out as "test"
    download: bool = True  # fetch a missing named set (fashion-mnist, cifar) when online
    mirror: str = ds.FASHION_MNIST_URL  # where fashion-mnist is fetched from

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", tuple(self.classes or ()))
        if self.dev_fraction is not None and self.dev_fraction < 0:
            object.__setattr__(self, "dev_fraction", None)  # the data section's -1: the paper's share

    @classmethod
    def of(cls, data: DataConfig) -> "DataOptions":
        """The options a run's data section sets."""
        return cls(dev_fraction=data.dev_fraction, skip_bad_images=data.skip_bad_images,
                   shuffle_buffer=data.shuffle_buffer, classes=data.classes)


def paper_dataset(spec: str) -> Optional[str]:
    """Which of the paper's datasets a spec holds: declared by its name (cifar10:DIR), else
    recognised from its training split's class counts (identity.py), else None. Never from
    the words of its path. Reads the training split's labels (no images); a spec that cannot
    be opened is None here, and fails with its own message where it is used."""
    named = by_name(spec)
    if named or spec.partition(":")[0].strip().lower() not in NAMED:
        return named
    try:
        return open_dataset(spec, "train", lambda image: image).identity  # labels only: no image is decoded
    except (DataError, OSError, ValueError):
        return None


DEV_SPLITS = ("dev", "train-minus-dev")  # parts of the training split (Appendix B.1.1's held-out share)
_SLICE = re.compile(r"^([\w-]+)\[\s*(-?\d+%?)?\s*:\s*(-?\d+%?)?\s*\]$")
SLICEABLE = ("train", "test", "val")  # the stored splits; dev and train-minus-dev are carved from train


def split_slice(split: str) -> tuple[str, Optional[tuple[str, str]]]:
    """A split as tfds writes a part of one, NAME[START:STOP] (`train[:65000]`, `train[10%:]`,
    `test[-500:]`), -> (NAME, (START, STOP) as written); a plain name -> (name, None)."""
    if "[" not in split:
        return split, None
    m = _SLICE.match(split.strip())
    if not m:
        raise DataError(f"split {split!r}: write a part of a split as tfds does, NAME[START:STOP] (train[:65000], train[10%:])")
    if m.group(1) not in SLICEABLE:
        raise DataError(f"split {split!r}: slice a stored split ({', '.join(SLICEABLE)}), not {m.group(1)}")
    return m.group(1), (m.group(2) or "", m.group(3) or "")


def slice_bounds(split: str, bounds: tuple[str, str], n: int) -> tuple[int, int]:
    """(start, stop) of a slice on a split of n examples, as tfds resolves it: a percentage
    rounded to the closest example, a negative bound counted from the end; a bound past the
    split's size, or a slice that holds nothing, is refused."""
    def at(text: str, default: int) -> int:
        if not text:
            return default
        value = round(int(text[:-1]) * n / 100) if text.endswith("%") else int(text)
        if abs(int(text.rstrip("%"))) > (100 if text.endswith("%") else n):
            raise DataError(f"split {split!r}: the split holds {n:,} examples, {text} runs past its end")
        return value + n if value < 0 else value

    start, stop = at(bounds[0], 0), at(bounds[1], n)
    if stop <= start:
        raise DataError(f"split {split!r}: examples {start}:{stop} of {n:,} are none; give START below STOP")
    return start, stop


def _sliced(dataset: Any, split: str, bounds: Optional[tuple[str, str]]) -> Any:
    """The dataset cut to the slice its split names (the examples in stored order)."""
    if bounds is None:
        return dataset
    if isinstance(dataset, WebDataset):
        keys, _ = dataset.keys_and_labels()
        start, stop = slice_bounds(split, bounds, len(keys))
        return dataset.restrict(set(keys[start:stop]))
    start, stop = slice_bounds(split, bounds, len(dataset))
    return dataset.select(np.arange(start, stop))


def _base_split(split: str) -> str:
    if split in ("train", *DEV_SPLITS):
        return "train"
    if split in ("test", "val"):
        return "test"
    raise DataError(f"unknown split {split!r}; use train, test (or val), dev or train-minus-dev")


def open_dataset(spec: str, split: str, transform: Callable, *, train: bool = False, seed: int = 0,
                 options: DataOptions = DataOptions(), held: Optional[dict[tuple, Any]] = None) -> Any:
    """A dataset by spec and split (see the package docstring): items (transform(image), label),
    `.class_names`, a length, and `.view(transform, seed=, train=)` for another reading of it.
    `train`: a training stream (wds: shuffled, with the seed); the augmentation itself is the
    transform's. `held`: the sets read into memory so far (digits, CIFAR, ...), by source,
    which this call adds to and reads from: a caller opening several splits of one source
    (train/inputs.py) reads its files once."""
    name, _, arg = spec.partition(":")
    name = name.strip().lower()
    if name not in NAMED and os.path.isdir(os.path.expanduser(spec)):  # a bare folder: it names no kind
        raise DataError(f"unknown dataset {spec!r}: it is a folder; did you mean imagefolder:{spec} (one sub-folder of "
                        f"images per class), or wds:{spec.rstrip('/')}/*.tar for WebDataset shards?")
    if name not in NAMED:
        near = suggest.hint(name, NAMED).lstrip("; ")
        raise DataError(
            f"unknown dataset {spec!r}; {near + ' The specs: ' if near else 'use one of '}{DATA_SPECS.replace(' | ', ', ')}")
    if name in WITH_PATH and not arg:
        raise DataError(f"{name} needs a path: --data {name}:PATH")
    sliced, (split, bounds) = split, split_slice(split)
    if bounds is not None and name == "vtab":
        raise DataError(f"split {sliced!r}: a VTAB task's splits are VTAB's own slices; use train, dev, test")
    base = _base_split(split)
    if not callable(transform):
        raise TypeError(f"open_dataset takes the images' transform (model_transform(config), vitlab.transform(model)), "
                        f"not {type(transform).__name__}")
    if not isinstance(options, DataOptions):
        raise TypeError(f"open_dataset's options are a DataOptions, not {type(options).__name__}")
    o = options
    if name == "wds":
        stream = WebDataset(arg, split, transform, train=train, seed=seed, shuffle_buffer=o.shuffle_buffer,
                            skip_bad_images=o.skip_bad_images, dev_fraction=o.dev_fraction,
                            classes=list(o.classes) or None, identity=by_name(spec))
        check_classes(spec, stream.class_names)
        return _sliced(stream, sliced, bounds)
    common = dict(seed=seed, skip_bad_images=o.skip_bad_images)
    if name == "vtab":  # its dev split is VTAB's own 200-example val set, not a share of train
        return open_vtab(arg, split, transform, held=held, **common)
    dataset: Any
    if name == "imagenet-val":
        dataset = imagenet_val(arg, base, transform, **common)
    elif name == "imagefolder":
        dataset = ds.image_folder(arg, base, transform, test_fraction=o.test_fraction, **common)
    elif name == "hf":
        dataset = ForeignDataset(hf_split(arg, base), transform, seed=seed)
    else:
        dataset = _arrays(spec, name, arg, base, transform, o, common, {} if held is None else held)
    check_classes(spec, dataset.class_names)
    # What the data is (`identity`): declared by the spec's name, else recognised from the
    # training split's class counts, never from its path; the dev split's size follows from it.
    dataset.identity = by_name(spec) or (recognise(np.bincount(dataset.labels)) if base == "train" else None)
    return _sliced(dev_part(dataset, split, o.dev_fraction) if split in DEV_SPLITS else dataset, sliced, bounds)


def _arrays(spec: str, name: str, arg: str, base: str, transform: Callable, o: DataOptions,
            common: dict[str, Any], held: dict[tuple, Any]) -> ds.ArrayDataset:
    """The sets held in memory as arrays: digits, synthetic, Fashion-MNIST, CIFAR; read once
    into `held` for every split of the source."""
    key = (name, arg, o.download, o.mirror)
    if key not in held:  # (arrays by split, class names) of each source; CIFAR's by default
        read = {"digits": lambda: (ds.digits_arrays(), [str(i) for i in range(10)]), "synthetic": lambda: synthetic.named(arg),
                "fashion-mnist": lambda: (ds.fashion_mnist_arrays(arg or None, o.download, o.mirror), ds.FASHION_MNIST_CLASSES)}
        held[key] = read.get(name, lambda: ds.cifar_arrays(name, arg or None, o.download))()
    arrays, classes = held[key]
    images, labels = arrays[base]
    if len(labels) and (labels.min() < 0 or labels.max() >= len(classes)):
        raise DataError(f"{spec}: {base} labels run from {labels.min()} to {labels.max()}, outside the "
                        f"{len(classes)} classes; the label file is damaged")
    return ds.ArrayDataset(images, labels, classes, transform, **common)


def dev_part(train_set: Any, split: str, explicit: Optional[float]) -> Any:
    """"dev" or "train-minus-dev" of an opened training split: the fixed held-out share its
    identity (or `explicit`) sets, selected, sharing the storage."""
    dev, rest = ds.dev_split(len(train_set), dev_fraction(train_set.identity, explicit))
    return train_set.select(dev if split == "dev" else rest)


def carves_dev(spec: str) -> bool:
    """Whether a spec's dev splits are selections of its opened training split (dev_part): every
    set held as files or arrays; not a WebDataset stream (its dev split is kept by each sample's
    key) nor a VTAB task (its dev split is VTAB's own 200-example val set)."""
    return spec.partition(":")[0].strip().lower() not in ("wds", "vtab")


def check_classes(spec: str, class_names: Sequence[str]) -> None:
    """Classification needs two classes at least: with one, every prediction is right and
    the loss is zero from the first step, a run that looks perfect and learns nothing."""
    if len(class_names) < 2:
        kind, _, root = str(spec).partition(":")
        inner = Path(os.path.expanduser(root), *class_names[:1])
        deeper = (f"; {inner} holds folders itself: did you mean {kind}:{inner}?" if kind == "imagefolder" and class_names
                  and inner.is_dir() and any(p.is_dir() for p in inner.iterdir()) else "")
        raise DataError(f"{spec}: {len(class_names)} class{'' if len(class_names) == 1 else 'es'} ({', '.join(class_names)}); "
                        f"classification needs at least two: check the data's class folders or labels{deeper}")
    if len(set(class_names)) != len(class_names):
        twice = sorted({c for c in class_names if list(class_names).count(c) > 1})
        raise DataError(f"{spec}: the class names {', '.join(twice[:5])} appear more than once; each class needs its own name")

