"""Bring your own data: any torch Dataset or DataLoader, torchvision's datasets, Hugging Face
`datasets` objects, as vitlab datasets of (normalised tensor, label).

`wrap(source, transform)` turns a source into what vitlab's evaluation and training read:

- a map-style dataset (a torch `Dataset`, a torchvision dataset, a Hugging Face
  `datasets.Dataset`) becomes a `ForeignDataset`: map-style, with `labels`, `class_names`
  and `select`, like vitlab's own sets;
- an iterable one (a torch `IterableDataset`, a Hugging Face `IterableDataset`, a
  `DataLoader`, whose batches are taken apart) becomes a `ForeignStream` of items;
- vitlab's own datasets are returned as they are.

Items may be `(image, label)` pairs or dicts (Hugging Face rows: the first of IMAGE_KEYS and
LABEL_KEYS present). An image that is a PIL image, a uint8 array or a uint8 tensor (HWC or
CHW) gets `transform` (the model's preprocessing); a float tensor counts as preprocessed
already and is used as it is. Class names come from `class_names=`, else the source's
`class_names`, `classes` (torchvision) or its label feature's names (Hugging Face ClassLabel).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vitlab.data.datasets import DataError, ImageDataset, apply_seeded, item_seed
from vitlab.data.loader import collate
from vitlab.extras import error_line, hf_cache, hub_client_errors, require
from vitlab.files import UnsafeNameError, child
from vitlab.files.documents import read_json

IMAGE_KEYS = ("image", "img", "pixel_values", "jpg", "png")
LABEL_KEYS = ("label", "labels", "fine_label", "target")


def is_hf_dataset(obj: Any) -> bool:
    """A Hugging Face `datasets` object (checked by module, so `datasets` need not be installed)."""
    return type(obj).__module__.split(".")[0] == "datasets"


def _keys(row: dict) -> tuple[str, str]:
    image = next((k for k in IMAGE_KEYS if k in row), None)
    label = next((k for k in LABEL_KEYS if k in row), None)
    if image is None or label is None:
        raise DataError(f"a dataset row with columns {sorted(row)}: vitlab reads the image from one of {', '.join(IMAGE_KEYS)} "
                        f"and the label from one of {', '.join(LABEL_KEYS)}; rename yours (datasets: .rename_column(old, new))")
    return image, label


def split_item(item: Any, what: str = "a dataset item") -> tuple[Any, Any]:
    """(image, label) of a dataset item, or (images, labels) of a collated batch: a pair/sequence,
    or a dict of a row or of columns."""
    if isinstance(item, dict):
        image_key, label_key = _keys(item)
        return item[image_key], item[label_key]
    if isinstance(item, (tuple, list)) and len(item) >= 2:
        return item[0], item[1]
    raise DataError(f"{what} of type {type(item).__name__}: expected (image, label) or a dict with image and label")


def to_image(image: Any) -> Any:
    """A PIL image for raw pixels (uint8 arrays or tensors, HWC or CHW, or greyscale HW);
    float tensors (already preprocessed) and PIL images are returned as they are."""
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, Tensor) and image.is_floating_point():
        return image
    a = image.numpy() if isinstance(image, Tensor) else np.asarray(image)
    if a.dtype != np.uint8:
        raise DataError(f"an image array of dtype {a.dtype}: give uint8 pixels, a PIL image, or a preprocessed float tensor")
    if a.ndim == 3 and a.shape[0] in (1, 3) and a.shape[-1] not in (1, 3):
        a = a.transpose(1, 2, 0)  # CHW -> HWC
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    return Image.fromarray(np.ascontiguousarray(a))


def prepare(image: Any, transform: Callable, seed: Optional[int]) -> Tensor:
    image = to_image(image)
    return image if isinstance(image, Tensor) else apply_seeded(transform, image, seed)


def class_names_of(source: Any, num_labels: Optional[int] = None) -> Optional[list[str]]:
    names = getattr(source, "class_names", None) or getattr(source, "classes", None)
    if names is None and is_hf_dataset(source):
        features = getattr(source, "features", None) or {}
        for key in LABEL_KEYS:
            names = getattr(features.get(key), "names", None) if key in features else None
            if names:
                break
    if names is None and isinstance(source, torch.utils.data.DataLoader):
        return class_names_of(source.dataset, num_labels)
    return [str(n) for n in names] if names else None


def _labels_of(source: Any) -> np.ndarray:
    """Every label of a map-style source: a column, an attribute, else one pass over it."""
    if is_hf_dataset(source):
        key = next((k for k in LABEL_KEYS if k in source.column_names), None)
        if key is None:
            _keys({c: None for c in source.column_names})  # raises, naming the columns
        return np.asarray(source[key], dtype=np.int64)
    for attr in ("labels", "targets"):
        values = getattr(source, attr, None)
        if values is not None and not callable(values):
            try:
                labels = np.asarray(values, dtype=np.int64)
            except (TypeError, ValueError):
                continue
            if labels.ndim == 1 and len(labels) == len(source):
                return labels
    return np.asarray([int(split_item(source[i])[1]) for i in range(len(source))], dtype=np.int64)


class ForeignDataset(ImageDataset):
    """A map-style source read through vitlab's dataset interface (labels, select, seeded
    augmentation per item, as the own datasets do)."""

    def __init__(self, source: Any, transform: Callable, class_names: Optional[list[str]] = None, seed: int = 0):
        labels = _labels_of(source)
        names = class_names or class_names_of(source) or [str(i) for i in range(int(labels.max(initial=-1)) + 1)]
        if len(labels) and labels.max() >= len(names):
            raise DataError(f"labels go up to {labels.max()} but there are {len(names)} class names")
        super().__init__(labels, names, transform, seed=seed)
        self.source = source

    def __getitem__(self, key: int | tuple[int, int]):
        index, seed = key if isinstance(key, tuple) else (key, item_seed(self.seed, 0, key))
        i = int(self.indices[index])
        image, _ = split_item(self.source[i])
        return prepare(image, self.transform, seed), int(self.all_labels[i])


class ForeignStream(torch.utils.data.IterableDataset):
    """An iterable source (a stream, or a DataLoader's batches taken apart), item by item."""

    def __init__(self, source: Any, transform: Callable, class_names: Optional[list[str]] = None):
        self.source, self.transform = source, transform
        self.class_names = class_names or class_names_of(source)

    def __iter__(self) -> Iterator[tuple[Tensor, int]]:
        batched = isinstance(self.source, torch.utils.data.DataLoader) and self.source.batch_size is not None
        for item in self.source:
            if not batched:
                image, label = split_item(item)
                yield prepare(image, self.transform, None), int(label)
                continue
            images, labels = split_item(item, "a DataLoader batch")
            for x, y in zip(images, labels, strict=True):
                yield prepare(x, self.transform, None), int(y)


def batches(source: Any, transform: Callable, batch_size: int = 128) -> Iterator[tuple[Tensor, Tensor]]:
    """(images, labels) batches of any source: a dataset is read in order through a loader;
    a DataLoader's (or any iterable's) batches are taken as they come, tuples or dicts, with
    raw images (PIL, uint8) preprocessed by `transform`."""
    if isinstance(source, torch.utils.data.Dataset) or is_hf_dataset(source):  # items, not batches
        loader = torch.utils.data.DataLoader(wrap(source, transform), batch_size=batch_size, collate_fn=collate)
        for images, labels, _ in loader:
            if len(labels):
                yield images, labels
        return
    for batch in source:
        images, labels = split_item(batch, "a DataLoader batch")
        if not isinstance(images, Tensor) or not images.is_floating_point():
            images = torch.stack([prepare(x, transform, None) for x in images])
        yield images, torch.as_tensor(labels, dtype=torch.long)


def wrap(source: Any, transform: Callable, class_names: Optional[list[str]] = None, seed: int = 0):
    """vitlab's view of any dataset (see the module docstring)."""
    if isinstance(source, ImageDataset) or type(source).__module__.startswith("vitlab.data"):  # already preprocessed
        return source
    if is_hf_dataset(source) and isinstance(source, dict):  # a DatasetDict is a dict of splits
        raise DataError(f"a Hugging Face DatasetDict with splits {sorted(source.keys())}: pass one split, e.g. data['train']")
    iterable = isinstance(source, (torch.utils.data.IterableDataset, torch.utils.data.DataLoader)) or (
        is_hf_dataset(source) and not hasattr(source, "__len__")
    )
    if iterable:
        return ForeignStream(source, transform, class_names)
    if not (hasattr(source, "__getitem__") and hasattr(source, "__len__")):
        raise DataError(f"cannot read data from a {type(source).__name__}: give a torch Dataset or DataLoader, "
                        "a torchvision dataset, a Hugging Face datasets object, or a vitlab data spec")
    return ForeignDataset(source, transform, class_names, seed)


# The hf:NAME data spec --------------------------------------------------------------------
HF_SPLITS = {"train": ("train",), "test": ("test", "validation", "valid", "val")}


# A folder written by save_to_disk: a DatasetDict's dataset_dict.json names its splits, each a
# folder whose state.json names its Arrow files and whose dataset_info.json holds the features.
SAVED = {"dataset_dict.json": {"splits": [str]}, "state.json": {"_data_files": [{"filename": str}]},
         "dataset_info.json": dict}


def load_saved(folder: Path, where: str) -> Any:
    """`datasets.load_from_disk(folder)`, its JSON files checked first (files.documents: a file
    that is not JSON, nested without end or of another shape is one DataError naming it), and
    any error of the library's own reading (a missing or damaged Arrow file) one line too."""
    datasets = require("datasets", "a save_to_disk folder", error=DataError)["datasets"]  # optional: pip install "vitlab[datasets]"
    again = f"{where} is a damaged save_to_disk folder: write it again with save_to_disk"
    splits = [folder]
    if (folder / "dataset_dict.json").exists():
        names = read_json(folder / "dataset_dict.json", SAVED["dataset_dict.json"], "dataset_dict.json", again, DataError)
        try:
            splits = [child(folder, name, "split") for name in names["splits"]]
        except UnsafeNameError as e:
            raise DataError(f"{folder / 'dataset_dict.json'}: {e}; {again}") from None
    for split in splits:
        for name in ("state.json", "dataset_info.json"):
            if (split / name).exists():
                read_json(split / name, SAVED[name], name, again, DataError)
    try:
        return datasets.load_from_disk(str(folder))
    except MemoryError:
        raise
    except Exception as e:  # the library's own reading of what the files name: one line, whatever its type
        raise DataError(f"{where}: cannot read it ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
                        f"{again}") from None


def hf_split(arg: str, split: str):
    """One split ("train" or "test") of a Hugging Face dataset: `arg` is a folder written by
    `save_to_disk` or a local dataset folder, else NAME[:CONFIG] read with `load_dataset`,
    which reads its own cache ($HF_DATASETS_CACHE) and, with $HF_HUB_OFFLINE=1, only that."""
    datasets = require("datasets", "hf: data", error=DataError)["datasets"]  # optional: pip install "vitlab[datasets]"
    folder, data = Path(arg).expanduser(), None
    if folder.is_dir() and any((folder / f).is_file() for f in ("dataset_dict.json", "dataset_info.json", "state.json")):
        data = load_saved(folder, f"hf:{arg}")
    errors: tuple[type[BaseException], ...] = (ConnectionError, FileNotFoundError, ValueError, *hub_client_errors())  # the Hub's HTTP errors too
    try:
        if data is None:
            name, _, config = arg.partition(":")
            data = datasets.load_dataset(str(folder) if folder.is_dir() else name, config or None, cache_dir=hf_cache("HF_DATASETS_CACHE", "datasets"))
    except errors as e:
        raise DataError(f"hf:{arg}: cannot read it ({error_line(e)}); offline, it must be in the datasets cache (load it once "
                        "online), or give a folder written by dataset.save_to_disk(DIR) as hf:DIR") from None
    if not isinstance(data, dict):  # one Dataset without splits (a DatasetDict is a dict): the training set
        if split != "train":
            raise DataError(f"hf:{arg} has no splits; only split 'train' (and dev / train-minus-dev) can be read")
        return data
    for key in HF_SPLITS[split]:
        if key in data:
            return data[key]
    raise DataError(f"hf:{arg} has splits {sorted(data.keys())}; vitlab's {split!r} reads {' or '.join(HF_SPLITS[split])}")
