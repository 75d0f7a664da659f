"""Datasets by name or path, the paper's preprocessing, and loaders that resume exactly.

The API other parts of vitlab (and users) call:

    open_dataset(spec, split, transform, *, train=False, seed=0, **options) -> dataset
        Items are (transform(image), label): with `model_transform(config)` (what
        `vitlab.transform(model)` returns) a normalised float tensor (C, H, W), label an int.
        The dataset has `.class_names` (list[str]) and a length.
        spec:   digits                 scikit-learn's 8x8 digits, shipped inside vitlab (offline)
                fashion-mnist[:FOLDER] IDX files (gz or not); default Debian's
                                       /usr/share/datasets/fashion-mnist; downloaded when absent
                cifar10[:FOLDER]       torchvision's format (cifar-10-batches-py); downloaded
                cifar100[:FOLDER]        by torchvision when absent and no FOLDER is given
                imagenet-val:DIR       the ImageNet validation images in file-name order (one
                                       folder per wnid, or flat with labels.txt), the order
                                       of the ReaL labels (see imagenet_val.py); split test
                vtab:TASK:ROOT         a VTAB-1k task (data/vtab.py): train = its 1,000
                                       examples, train-minus-dev its 800, dev its 200 val,
                                       test its full test split, as VTAB defines them
                imagefolder:PATH       PATH/CLASS/IMAGE, with PATH/train + PATH/val|test
                                       splits, or a fixed 20% held out as "test"
                wds:PATTERN            WebDataset tar shards (.tar, .tar.gz), brace patterns or
                                       a folder of train-*/test-* shards; streamed (an
                                       IterableDataset split across loader workers and processes)
                synthetic:TASK[:SEED]  a procedural 16x16 task with a known answer: halfswap or
                                       crossover (see synthetic.py; the `synthetic` recipe)
                hf:NAME[:CONFIG]       a Hugging Face dataset by name, from the datasets cache
                                       (offline with HF_HUB_OFFLINE=1), or hf:DIR for a folder
                                       written by save_to_disk; splits train and test (or
                                       validation); needs `datasets` (vitlab[datasets])
        split:  "train", "test" (= "val"), "dev" (a held-out part of train, fixed seed: 2% of
                CIFAR, 10% of others, as the paper) or "train-minus-dev" (the rest).
        transform: what each image goes through: the model's preprocessing for evaluation
                (model_transform(config)), its augmentation for training
                (model_transform(config, train=True, crop_scale=..., randaugment=...,
                autoaugment=..., trivialaugment=..., augmix=..., random_erasing=...)).
        train:  True = a training stream (wds: shuffled, with the seed); the augmentation
                itself is the transform's.
        options: dev_fraction; skip_bad_images (unreadable images are dropped and counted
                instead of raising BadImageError); shuffle_buffer and classes (wds);
                test_fraction (imagefolder); download (default True: fetch a missing named
                set when online), mirror (fashion-mnist).
    read_image(path) -> PIL.Image       decode a file or raise BadImageError naming it
    training_subset(dataset, fraction=1.0, size=0, seed=0) -> dataset
                                        a fixed, class-balanced part of a training set
                                        (--train-fraction, --train-size; see subset.py)
    make_loader(dataset, batch_size, seed=, rank=, world=, train=, start_step=, num_steps=,
                num_workers=) -> DataLoader of (images, labels, skipped names): a whole run's
                training batches (exactly resumable, split over processes), or one
                evaluation pass
    transforms.eval_transform / transforms.train_transform / transforms.model_transform
    decode.training_transform(decode, ...) / decode.fast_eval_transform / fast_model_transform
                the same augmentation and preprocessing, a JPEG decoded only at the DCT scale
                its crop needs (data.decode, data.eval_decode; uint8 training images that
                decode.model_input normalises on the device; "cuda": decoded on the GPU)
    foreign.wrap(source, transform) -> any torch Dataset or DataLoader, torchvision dataset or
                Hugging Face datasets object as a vitlab dataset (see foreign.py)

This package never imports vitlab.models: data knows nothing about the network.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from vitlab.config.run import SHUFFLE_BUFFER
from vitlab.data import datasets as ds, transforms as T
from vitlab.data.datasets import BadImageError, DataError, read_image
from vitlab.data.foreign import ForeignDataset, hf_split
from vitlab.data.identity import DEV_FRACTIONS, PAPER_DATASETS, by_name, dev_fraction, recognise
from vitlab.data.imagenet_val import imagenet_val
from vitlab.data.loader import batches_per_epoch, collate, make_loader
from vitlab.data import synthetic
from vitlab.data.subset import training_subset
from vitlab.data.vtab_sources import open_vtab
from vitlab.data.wds import WebDataset

NAMED = ("digits", "fashion-mnist", "cifar10", "cifar100", "imagefolder", "imagenet-val", "vtab", "wds", "hf",
         "synthetic")


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


def _base_split(split: str) -> str:
    if split in ("train", "dev", "train-minus-dev"):
        return "train"
    if split in ("test", "val"):
        return "test"
    raise DataError(f"unknown split {split!r}; use train, test (or val), dev or train-minus-dev")


def open_dataset(
    spec: str,
    split: str,
    transform: Callable,
    *,
    train: bool = False,
    seed: int = 0,
    **options: Any,
):
    """A dataset by spec and split; see the module docstring."""
    name, _, arg = spec.partition(":")
    name = name.strip().lower()
    if name not in NAMED:
        raise DataError(
            f"unknown dataset {spec!r}; use one of digits, fashion-mnist[:FOLDER], cifar10[:FOLDER], "
            "cifar100[:FOLDER], imagefolder:PATH, imagenet-val:DIR, vtab:TASK:ROOT, wds:PATTERN, hf:NAME (a Hugging Face "
            "dataset), synthetic:TASK"
        )
    if name in ("imagefolder", "imagenet-val", "vtab", "wds", "hf", "synthetic") and not arg:
        raise DataError(f"{name} needs a path: --data {name}:PATH")
    base = _base_split(split)
    if not callable(transform):
        raise TypeError(f"open_dataset takes the images' transform (model_transform(config), vitlab.transform(model)), "
                        f"not {type(transform).__name__}")
    _check_options(options)
    explicit = options.get("dev_fraction")
    explicit = None if explicit is None or explicit < 0 else float(explicit)
    skip = bool(options.get("skip_bad_images", False))
    download = bool(options.get("download", True))

    if name == "wds":
        stream = WebDataset(
            arg, split, transform, train=train, seed=seed, shuffle_buffer=int(options.get("shuffle_buffer", SHUFFLE_BUFFER)),
            skip_bad_images=skip, dev_fraction=explicit, classes=options.get("classes"), identity=by_name(spec),
        )
        check_classes(spec, stream.class_names)
        return stream
    common = dict(seed=seed, skip_bad_images=skip)
    if name == "vtab":  # its dev split is VTAB's own 200-example val set, not a share of train
        return open_vtab(arg, split, transform, **common)
    if name == "imagenet-val":
        dataset = imagenet_val(arg, base, transform, **common)
    elif name == "imagefolder":
        dataset = ds.image_folder(arg, base, transform, test_fraction=options.get("test_fraction", 0.2), **common)
    elif name == "hf":
        dataset = ForeignDataset(hf_split(arg, base), transform, seed=seed)
    else:
        if name == "digits":
            arrays, classes = ds.digits_arrays(), [str(i) for i in range(10)]
        elif name == "synthetic":
            arrays, classes = synthetic.named(arg)
        elif name == "fashion-mnist":
            mirror = options.get("mirror", ds.FASHION_MNIST_URL)
            arrays, classes = ds.fashion_mnist_arrays(arg or None, download, mirror), ds.FASHION_MNIST_CLASSES
        else:
            arrays, classes = ds.cifar_arrays(name, arg or None, download)
        images, labels = arrays[base]
        if len(labels) and (labels.min() < 0 or labels.max() >= len(classes)):
            raise DataError(f"{spec}: {base} labels run from {labels.min()} to {labels.max()}, outside the "
                            f"{len(classes)} classes; the label file is damaged")
        dataset = ds.ArrayDataset(images, labels, classes, transform, **common)
    check_classes(spec, dataset.class_names)
    return _dev_part(dataset, spec, split, base, explicit)


OPTIONS = {"dev_fraction", "skip_bad_images", "shuffle_buffer", "classes", "download", "test_fraction", "mirror"}


def _check_options(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise TypeError(f"open_dataset got unknown option(s) {unknown}; known: {', '.join(sorted(OPTIONS))}")


def _dev_part(dataset: Any, spec: str, split: str, base: str, explicit: Optional[float]) -> Any:
    """Say what the data is (`identity`: declared by the spec's name, else recognised from
    the training split's class counts, never from its path) and carve the dev split, whose
    size follows from it (identity.py)."""
    dataset.identity = by_name(spec) or (recognise(np.bincount(dataset.labels)) if base == "train" else None)
    if split in ("dev", "train-minus-dev"):
        dev, rest = ds.dev_split(len(dataset), dev_fraction(dataset.identity, explicit))
        dataset = dataset.select(dev if split == "dev" else rest)
    return dataset


def check_classes(spec: str, class_names: Sequence[str]) -> None:
    """Classification needs two classes at least: with one, every prediction is right and
    the loss is zero from the first step, a run that looks perfect and learns nothing."""
    if len(class_names) < 2:
        raise DataError(
            f"{spec}: {len(class_names)} class{'' if len(class_names) == 1 else 'es'} ({', '.join(class_names)}); "
            "classification needs at least two: check the data's class folders or labels"
        )
    if len(set(class_names)) != len(class_names):
        twice = sorted({c for c in class_names if list(class_names).count(c) > 1})
        raise DataError(f"{spec}: the class names {', '.join(twice[:5])} appear more than once; each class needs its own name")


__all__ = [
    "training_subset",
    "DEV_FRACTIONS", "BadImageError", "DataError", "open_dataset", "paper_dataset", "read_image", "make_loader", "collate", "batches_per_epoch",
]
