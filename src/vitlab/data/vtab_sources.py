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
and distance, dSprites, SmallNORB, KITTI) reads its label from the source's features. Of a
tfds copy, only the config and version VTAB pins are read (`Task.tfds`: the newest version
that matches); a folder holding only others is refused, naming what VTAB reads and where it
says so, unless the spec accepts another one explicitly: `vtab:TASK@[CONFIG/]VERSION:ROOT`
(`vtab:pets@4.0.0:ROOT`), which the run's data description (`describe`) records.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
from PIL import Image

from vitlab.config.fields import is_digits
from vitlab.data.datasets import IMAGE_EXTENSIONS, DataError, ImageDataset
from vitlab.data.foreign import load_saved
from vitlab.data.images import check_size, decoded, read_image
from vitlab.data.tfrecord import Records, prepared, shards, version_key
from vitlab.data.vtab import SPLITS, Task, get_task, task_label, task_split


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
                     key=lambda c: (0, int(c), c) if is_digits(c) else (1, 0, c))
    numeric = all(is_digits(c) for c in classes)
    label = {c: int(c) if numeric else k for k, c in enumerate(classes)}
    out = {}
    for s in splits:
        items = sorted(((f, label[c.name]) for c in (task_dir / s).iterdir() if c.is_dir() for f in c.iterdir()
                        if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS), key=lambda x: x[0].name)
        out[s] = Source(len(items), functools.partial(_file_image, items), functools.partial(_file_label, items))
    return out, ([] if numeric else classes)


# What each Source reads (functools.partial of these: their types known, and picklable).
def _file_image(items: list[tuple[Path, int]], i: int) -> Image.Image:
    return read_image(items[i][0])


def _file_label(items: list[tuple[Path, int]], i: int) -> dict[str, Any]:
    return {"label": items[i][1]}


def _hf_row_image(split: Any, key: str, i: int) -> Image.Image:
    return _hf_image(split[i][key])


def _hf_row_rest(rest: Any, i: int) -> dict[str, Any]:
    return _flatten(rest[i])


def _tfds_image(examples: Any, split: str, i: int) -> Image.Image:
    return read_image(examples[i]["image"][0], f"{split} record {i}")


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
    data = load_saved(folder, str(folder))  # its JSON files checked, the library's errors one line
    splits = data if isinstance(data, dict) else {"train": data}
    out = {}
    for name, split in splits.items():
        image_key = next((k for k in ("image", "img") if k in split.column_names), None)
        if image_key is None:
            raise DataError(f"{folder}: split {name} has no image column (columns: {', '.join(split.column_names)})")
        rest = split.remove_columns([image_key])  # the features without decoding an image
        out[name] = Source(len(split), functools.partial(_hf_row_image, split, image_key), functools.partial(_hf_row_rest, rest))
    return out


def _tfds_sources(shards: dict[str, list[Path]]) -> dict[str, Source]:
    out = {}
    for name, files in shards.items():
        examples = Records(files)  # (image bytes kept encoded: decoded on demand)
        out[name] = Source(len(examples), functools.partial(_tfds_image, examples, name), examples.__getitem__)
    return out


def _matches(version: str, pin: str) -> bool:
    wanted, parts = pin.split("."), version.split(".")  # 3.0.0.9 is not 3.0.0: every part is compared
    return len(wanted) == len(parts) and all(p in ("*", v) for p, v in zip(wanted, parts, strict=True))


def pinned(task: Task, builder_dir: Path, accept: str = "") -> Path:
    """The prepared tfds folder of `task` VTAB reads: its config, the newest version matching
    its pin; with `accept` ("[CONFIG/]VERSION") that one instead. Anything else is refused."""
    copies = prepared(builder_dir)
    config, pin = task.config, task.version
    if accept:
        config, _, pin = accept.rpartition("/") if "/" in accept else (config, "", accept)
    fits = [c for c in copies if c[0] == config and _matches(c[1], pin)]
    if fits:
        return max(fits, key=lambda c: version_key(c[1]))[2]
    held = ", ".join(f"{c}:{v}" if c else v for c, v, _ in copies) or "no prepared version"
    wanted = f"{config}:{pin}" if config else pin
    if accept:
        raise DataError(f"{task.name}: {builder_dir} holds {held}, not the {wanted} the spec accepts")
    raise DataError(f"{task.name}: {builder_dir} holds {held}; VTAB reads {task.tfds}: prepare that, or accept another "
                    f"with vtab:{task.name}@[CONFIG/]VERSION:ROOT", reason="version")


def locate(task: Task, root: Path) -> Optional[tuple[str, Path]]:
    """Which form the task's data takes and where ("folders", "datasets" or "tfds": the
    builder's folder), looking only at folder names; None when absent."""
    own = root / task.name
    if (own / "dataset_dict.json").is_file():
        return "datasets", own
    if own.is_dir() and any((own / s).is_dir() for s in ("train", "validation", "test")):
        return "folders", own
    source = root / task.source
    if (source / "dataset_dict.json").is_file():
        return "datasets", source
    if prepared(source):
        return "tfds", source
    return None


def describe(task: Task, root: Path, accept: str = "") -> Optional[dict[str, Any]]:
    """What a run of `task` reads, for its results: the form, the folder, and for tfds the
    version read, the one VTAB pins and whether the user accepted another (None: no data)."""
    found = locate(task, root)
    if found is None:
        return None
    kind, folder = found
    if kind != "tfds":
        return {"form": kind, "folder": str(folder)}
    read = pinned(task, folder, accept)
    config = f"/{read.parent.name}" if read.parent != folder else ""
    return {"form": "tfds", "folder": str(read), "tfds": f"{task.source}{config}:{read.name}", "vtab_pins": task.tfds,
            "accepted_other": bool(accept)}


def find_sources(task: Task, root: Path, accept: str = "", held: Optional[dict[tuple, Any]] = None
                 ) -> Optional[tuple[dict[str, Source], Optional[list[str]], str]]:
    """(sources by split, class names of an image-folder copy or None, where) or None when absent;
    read once into `held` (by folder) for every split and task of that source (the dSprites
    and SmallNORB tasks share theirs)."""
    found = locate(task, root)
    if found is None:
        return None
    kind, folder = found
    folder = pinned(task, folder, accept) if kind == "tfds" else folder
    held, key = {} if held is None else held, ("vtab", str(folder))
    if key not in held:
        sources, classes = _folder_sources(folder) if kind == "folders" else (
            _hf_sources(folder) if kind == "datasets" else _tfds_sources(shards(folder)), None)
        held[key] = sources, classes, str(folder)
    return held[key]


def _labels(task: Task, items: list[tuple[Source, int]], folders: bool, where: str) -> list[int]:
    """Each item's task label; a source without the feature the task reads is refused."""
    try:
        return [src.features(i)["label"] if folders else task_label(task, src.features(i)) for src, i in items]
    except KeyError as e:
        have = ", ".join(sorted(items[0][0].features(items[0][1]))) if items else "none"
        raise DataError(f"{task.name} ({where}): the source has no feature {e.args[0]!r}, which VTAB reads "
                        f"{task.name}'s label from (features: {have}); is this {task.tfds}?", reason="no-feature") from None


class VtabDataset(ImageDataset):
    """One VTAB-1k split of a task (vtab.SPLITS names them), labels read up front."""

    def __init__(self, task: Task, root: Path, split: str, transform: Callable, accept: str = "",
                 held: Optional[dict[tuple, Any]] = None, **kw: Any):
        found = find_sources(task, root, accept, held)
        if found is None:
            raise DataError(where_to_put(task, root))
        sources, folder_classes, self.where = found
        try:
            pieces = task_split(task, SPLITS[split], {s: src.n for s, src in sources.items()})
        except DataError as e:
            raise DataError(f"{task.name} ({self.where}): {e}") from None
        self.items = [(sources[s], i) for s, start, stop in pieces for i in range(start, stop)]
        labels = _labels(task, self.items, folder_classes is not None, self.where)
        if labels and (min(labels) < 0 or max(labels) >= task.classes):
            raise DataError(f"{task.name} ({self.where}): labels run from {min(labels)} to {max(labels)}, outside the "
                            f"task's {task.classes} classes")
        names = [str(c) for c in range(task.classes)]
        if folder_classes:  # named label folders
            names = folder_classes + [str(c) for c in range(len(folder_classes), task.classes)]
        self.task = task
        # The source's own 0/1 pixels (tfds, datasets) scaled as VTAB scales them; image folders hold images.
        self.scale = task.binary_pixels and folder_classes is None
        super().__init__(np.asarray(labels, dtype=np.int64), names, transform, **kw)

    def _load(self, i: int) -> Image.Image:
        source, index = self.items[i]
        image = source.image(index)
        return image.point(lambda v: v * 255) if self.scale else image

    def _name(self, i: int) -> str:
        return f"{self.task.name} item {i} ({self.where})"


def parse_spec(arg: str) -> tuple[Task, str, Path]:
    """`TASK[@[CONFIG/]VERSION]:ROOT` -> (task, the tfds version accepted instead of VTAB's, root)."""
    name, sep, root = arg.partition(":")
    if not sep or not root:
        raise DataError(f"vtab:{arg}: write vtab:TASK:ROOT, e.g. vtab:cifar100:~/tensorflow_datasets")
    name, _, accept = name.partition("@")
    return get_task(name), accept, Path(root).expanduser()


def open_vtab(arg: str, split: str, transform: Callable, **kw: Any) -> VtabDataset:
    """`vtab:TASK:ROOT` (vitlab.data.open_dataset): one split of a VTAB-1k task."""
    task, accept, root = parse_spec(arg)
    if split not in SPLITS:
        raise DataError(f"vtab:{arg}: unknown split {split!r}; use {', '.join(SPLITS)}")
    return VtabDataset(task, root, split, transform, accept=accept, **kw)
