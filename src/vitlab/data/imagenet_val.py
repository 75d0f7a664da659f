"""The ImageNet validation set in file-name order, the order ImageNet ReaL's labels follow.

Beyer et al. 2020 ("Are we done with ImageNet?") publish their reassessed labels as one JSON
list with one list of class ids per validation image, in the order of the file names
ILSVRC2012_val_00000001.JPEG ... ILSVRC2012_val_00050000.JPEG. `imagenet-val:DIR` reads
either layout researchers keep the 50,000 images in:

    DIR/n01440764/ILSVRC2012_val_00000293.JPEG   one folder per class (the wnid), the
                                                 layout of the common "valprep" script; the
                                                 classes in sorted wnid order are the
                                                 standard 1,000 class ids
    DIR/ILSVRC2012_val_00000001.JPEG + DIR/labels.txt
                                                 flat, with one class id per line of
                                                 labels.txt, in file-name order

Either way item i is the i-th file name in sorted order (class folders ignored), so that
item i meets line i of the ReaL JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from vitlab.data.datasets import IMAGE_EXTENSIONS, DataError, FileDataset


def _images(folder: Path) -> list[Path]:
    return [f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS]


def _flat_labels(root: Path, count: int) -> tuple[np.ndarray, list[str]]:
    path = root / "labels.txt"
    if not path.is_file():
        raise DataError(f"imagenet-val:{root}: the images lie flat but there is no labels.txt beside them; give one "
                        "class id per line in file-name order, or sort the images into one folder per class (wnid)")
    try:
        labels = np.array([int(line) for line in path.read_text().split()], dtype=np.int64)
    except ValueError:
        raise DataError(f"{path}: every line must be one integer class id") from None
    if len(labels) != count:
        raise DataError(f"{path}: {len(labels)} labels for {count} images; one per image, in file-name order")
    if labels.min() < 0:
        raise DataError(f"{path}: class ids must be 0 or more")
    classes = [str(i) for i in range(max(int(labels.max()) + 1, 1000))]
    return labels, classes


def imagenet_val(path: str, split: str, transform: Callable, **kw) -> FileDataset:
    """The validation images of DIR in sorted file-name order, with their labels."""
    root = Path(path).expanduser()
    if split != "test":
        raise DataError(f"imagenet-val:{path}: the ImageNet validation set has one split; use --split test (or val)")
    if not root.is_dir():
        raise DataError(f"imagenet-val:{root} is not a folder; give the folder of the 50,000 validation images")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if folders:
        classes = [p.name for p in folders]
        found = [(f, label) for label, folder in enumerate(folders) for f in _images(folder)]
        if not found:
            raise DataError(f"imagenet-val:{root}: no images ({', '.join(IMAGE_EXTENSIONS)}) in its class folders")
        found.sort(key=lambda item: item[0].name)
        names = [f.name for f, _ in found]
        if len(set(names)) != len(names):
            raise DataError(f"imagenet-val:{root}: a file name appears in two class folders; the file-name order "
                            "that ReaL labels follow needs each name once")
        files, labels = [f for f, _ in found], np.array([label for _, label in found], dtype=np.int64)
    else:
        files = sorted(_images(root), key=lambda f: f.name)
        if not files:
            raise DataError(f"imagenet-val:{root}: no images ({', '.join(IMAGE_EXTENSIONS)}) and no class folders")
        labels, classes = _flat_labels(root, len(files))
    return FileDataset(files, labels, classes, transform, **kw)
