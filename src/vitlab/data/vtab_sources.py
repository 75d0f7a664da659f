"""Where a VTAB-1k task's data lives, in the forms researchers keep it, read offline.

For task T (vtab.TASKS) under a root folder ROOT, the first of these that exists:

    ROOT/T/{train,validation,test}/LABEL/FILE    image folders: one folder per split the
                                                 task slices (tfds's split names), one per
                                                 task label (0..K-1, or names, sorted);
                                                 files in file-name order, which must be the
                                                 source order (name them by record index)
    ROOT/T/ or ROOT/SOURCE/ with dataset_dict.json
                                                 a Hugging Face DatasetDict written by
                                                 save_to_disk: an image column and the
                                                 task's label feature (nested features,
                                                 e.g. CLEVR's objects, flattened as "objects/size")
    ROOT/SOURCE/[CONFIG/]VERSION/*.tfrecord-*    a tfds data_dir as tfds.load(...,
                                                 data_dir=ROOT) prepares it: ROOT may be
                                                 ~/tensorflow_datasets itself; read without
                                                 TensorFlow (tfrecord.py)

SOURCE is the tfds builder's name (`clevr`, `svhn_cropped`, ...); a derived task (CLEVR count
and distance, dSprites, SmallNORB, KITTI) reads its label from the source's features.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
from PIL import Image

from vitlab.data.datasets import IMAGE_EXTENSIONS, DataError, ImageDataset
from vitlab.data.images import check_size, decoded, read_image
from vitlab.data.tfrecord import read_examples, tfds_shards
from vitlab.data.vtab import SPLITS, Task, get_task, task_label, task_splits


def where_to_put(task: Task, root: Path) -> str:
    """The line a missing task gets: the three places and forms it may take."""
    return (f"{task.name}: no data; put it in {root / task.name}/{{train,validation,test}}/LABEL/ (image folders), "
            f"{root / task.source}/ (a datasets save_to_disk folder) or tfds's prepared {task.source} under {root}")


class Source:
    """One split of a source: its length, and each example's (image, features)."""

    def __init__(self, n: int, image: Callable[[int], Image.Image], features: Callable[[int], dict[str, Any]]):
        self.n, self.image, self.features = n, image, features


def _folder_sources(task_dir: Path) -> tuple[dict[str, Source], list[str]]:
    """Image folders: label folders named 0..K-1 are those labels; named ones count in sorted
    order (the same names in every split)."""
    splits = [s for s in ("train", "validation", "test") if (task_dir / s).is_dir()]
    classes = sorted({p.name for s in splits for p in (task_dir / s).iterdir() if p.is_dir()},
                     key=lambda c: (0, int(c), c) if c.isdigit() else (1, 0, c))
    numeric = all(c.isdigit() for c in classes)
    label = {c: int(c) if numeric else k for k, c in enumerate(classes)}
    out = {}
    for s in splits:
        items = sorted(((f, label[c.name]) for c in (task_dir / s).iterdir() if c.is_dir() for f in c.iterdir()
                        if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS), key=lambda x: x[0].name)
        out[s] = Source(len(items), lambda i, it=items: read_image(it[i][0]), lambda i, it=items: {"label": it[i][1]})
    return out, ([] if numeric else classes)


def _flatten(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict) and not ("bytes" in value and "path" in value):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = np.asarray(value).ravel().tolist() if isinstance(value, list) else value
    return flat


def _hf_image(value: Any) -> Image.Image:
    if isinstance(value, Image.Image):
        check_size(value.width, value.height, "a Hugging Face image")
        return decoded(value)
    if isinstance(value, dict) and value.get("bytes"):
        return read_image(value["bytes"], value.get("path") or "a Hugging Face image")  # data/images.py's checks
    return Image.fromarray(np.asarray(value, dtype=np.uint8))


def _hf_sources(folder: Path) -> dict[str, Source]:
    try:
        import datasets  # optional: pip install 'vitlab[datasets]'
    except ImportError:
        raise DataError(f"{folder}: a datasets save_to_disk folder needs the datasets package: "
                        "pip install 'vitlab[datasets]'") from None
    data = datasets.load_from_disk(str(folder))
    splits = data if isinstance(data, dict) else {"train": data}
    out = {}
    for name, split in splits.items():
        image_key = next((k for k in ("image", "img") if k in split.column_names), None)
        if image_key is None:
            raise DataError(f"{folder}: split {name} has no image column (columns: {', '.join(split.column_names)})")
        rest = split.remove_columns([image_key])  # the features without decoding an image
        out[name] = Source(len(split), lambda i, s=split, k=image_key: _hf_image(s[i][k]),
                           lambda i, r=rest: _flatten(r[i]))
    return out


def _tfds_sources(shards: dict[str, list[Path]]) -> dict[str, Source]:
    out = {}
    for name, files in shards.items():
        examples = read_examples(files)  # (image bytes kept encoded: decoded on demand)
        out[name] = Source(len(examples), lambda i, e=examples, n=name: read_image(e[i]["image"][0], f"{n} record {i}"),
                           lambda i, e=examples: e[i])
    return out


def locate(task: Task, root: Path) -> Optional[tuple[str, Path]]:
    """Which form the task's data takes and where ("folders", "datasets" or "tfds"), looking
    only at folder names; None when absent."""
    own = root / task.name
    if (own / "dataset_dict.json").is_file():
        return "datasets", own
    if own.is_dir() and any((own / s).is_dir() for s in ("train", "validation", "test")):
        return "folders", own
    source = root / task.source
    if (source / "dataset_dict.json").is_file():
        return "datasets", source
    if tfds_shards(source):
        return "tfds", source
    return None


def find_sources(task: Task, root: Path) -> Optional[tuple[dict[str, Source], Optional[list[str]], str]]:
    """(sources by split, class names of an image-folder copy or None, where) or None when absent."""
    found = locate(task, root)
    if found is None:
        return None
    kind, folder = found
    if kind == "folders":
        sources, classes = _folder_sources(folder)
        return sources, classes, str(folder)
    if kind == "datasets":
        return _hf_sources(folder), None, str(folder)
    return _tfds_sources(tfds_shards(folder)), None, str(folder)


class VtabDataset(ImageDataset):
    """One VTAB-1k split of a task (vtab.SPLITS names them), labels read up front."""

    def __init__(self, task: Task, root: Path, split: str, transform: Callable, **kw: Any):
        found = find_sources(task, root)
        if found is None:
            raise DataError(where_to_put(task, root))
        sources, folder_classes, self.where = found
        try:
            pieces = task_splits(task, {s: src.n for s, src in sources.items()})[SPLITS[split]]
        except DataError as e:
            raise DataError(f"{task.name} ({self.where}): {e}") from None
        self.items = [(sources[s], i) for s, start, stop in pieces for i in range(start, stop)]
        labels = [src.features(i)["label"] if folder_classes is not None else task_label(task, src.features(i))
                  for src, i in self.items]
        if labels and (min(labels) < 0 or max(labels) >= task.classes):
            raise DataError(f"{task.name} ({self.where}): labels run from {min(labels)} to {max(labels)}, outside the "
                            f"task's {task.classes} classes")
        names = [str(c) for c in range(task.classes)]
        if folder_classes:  # named label folders
            names = folder_classes + [str(c) for c in range(len(folder_classes), task.classes)]
        self.task = task
        super().__init__(np.asarray(labels, dtype=np.int64), names, transform, **kw)

    def _load(self, i: int) -> Image.Image:
        source, index = self.items[i]
        return source.image(index)

    def _name(self, i: int) -> str:
        return f"{self.task.name} item {i} ({self.where})"


def open_vtab(arg: str, split: str, transform: Callable, **kw: Any) -> VtabDataset:
    """`vtab:TASK:ROOT` (vitlab.data.open_dataset): one split of a VTAB-1k task."""
    name, sep, root = arg.partition(":")
    if not sep or not root:
        raise DataError(f"vtab:{arg}: write vtab:TASK:ROOT, e.g. vtab:cifar100:~/tensorflow_datasets")
    if split not in SPLITS:
        raise DataError(f"vtab:{arg}: unknown split {split!r}; use {', '.join(SPLITS)}")
    return VtabDataset(get_task(name), Path(root).expanduser(), split, transform, **kw)
