"""The 19 tasks of VTAB-1k (Zhai et al. 2019; the paper's Table 2 VTAB column, Fig. 2, Table 9).

Each task trains on 1,000 examples, 800 "train" and 200 "val" for choosing hyper-parameters
(then train on all 1,000), and is evaluated on its full test split. The splits are taken
exactly as the VTAB definition (google-research/task_adaptation) takes them: contiguous
slices of the source's stored order (tfds's own deterministic order), no random draw, so
they are the same on every machine and in every run. `train[:800]` is the first 800 of the
source's train split; `train[90%:+200]` the 200 that start at 90% of it (VTAB counts the
percentage as `90 * n // 100`); `test[50%:]` the second half of the test split.

Tasks whose source is one dataset (CLEVR, dSprites, SmallNORB, KITTI) derive their label
from its features, as VTAB does (`LABELS`). Each task reads the tfds builder, config and
version VTAB pins (`Task.tfds`, from task_adaptation/data/TASK.py: `dmlab:2.0.1`,
`kitti:3.1.0`, `diabetic_retinopathy_detection/btgraham-300:3.*.*`, ...); dSprites stores its
pixels as 0/1, which VTAB multiplies by 255 (`binary_pixels`). The groups: Natural (7), Specialized (4),
Structured (8). Where the data lives and the forms it may take are in vtab_sources.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from vitlab import suggest
from vitlab.data.datasets import DataError

GROUPS = ("Natural", "Specialized", "Structured")
# vitlab's split names (what a fine-tuning run asks for) -> the VTAB-1k split they read.
SPLITS = {"train": "train800val200", "train-minus-dev": "train800", "dev": "val200", "test": "test", "val": "test"}


@dataclass(frozen=True)
class Task:
    name: str  # vitlab's name, also the folder an image-folder copy lives in
    title: str  # as Table 9 heads its column
    group: str
    classes: int
    tfds: str  # the tfds name VTAB loads, "BUILDER[/CONFIG]:VERSION" (task_adaptation/data/*.py pins it)
    train800: str  # slices of the source's splits, VTAB's own definition
    val200: str
    test: str
    label: str = "label"  # a source feature, or a derivation in LABELS
    # The source stores pixels as 0/1 and VTAB multiplies them by 255 (task_adaptation/data/dsprites.py).
    binary_pixels: bool = False

    @property
    def source(self) -> str:
        """The tfds builder: the folder name of the task's tfds or datasets copy."""
        return self.tfds.split(":")[0].split("/")[0]

    @property
    def config(self) -> str:
        """The tfds config VTAB reads ("" for a builder without configs)."""
        name = self.tfds.split(":")[0]
        return name.split("/", 1)[1] if "/" in name else ""

    @property
    def version(self) -> str:
        """The tfds version VTAB pins: exact ("3.1.0") or a major version ("3.*.*")."""
        return self.tfds.split(":")[1]


def _bin(value: float, thresholds: tuple[float, ...]) -> int:
    """The largest i with thresholds[i] < value (VTAB's `reduce_max(where(thrs - x < 0))`)."""
    return max(i for i, t in enumerate(thresholds) if t < value)


def _clevr_distance(f: dict[str, Any]) -> int:
    depth = min(f["objects/pixel_coords"][2::3])  # (x, y, depth) per object
    return _bin(depth, (0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0))


def _kitti_distance(f: dict[str, Any]) -> int:
    z = f["objects/location"][2::3]  # (x, y, z) in metres from the camera, per object
    vehicles = [d for d, kind in zip(z, f["objects/type"], strict=True) if kind < 3]  # Car, Van, Truck
    return _bin(min(vehicles + [1000.0]), (-100.0, 8.0, 20.0, 999.0))  # 3 distances + "no vehicle"


# Labels VTAB derives from a source's features (flattened as tfds stores them: "objects/size").
LABELS: dict[str, Callable[[dict[str, Any]], int]] = {
    "clevr_count": lambda f: len(f["objects/size"]) - 3,  # 3..10 objects -> 8 classes
    "clevr_distance": _clevr_distance,
    "kitti_distance": _kitti_distance,
    "dsprites_location": lambda f: int(f["label_x_position"][0] // (32 / 16)),  # 32 positions -> 16 bins
    "dsprites_orientation": lambda f: int(f["label_orientation"][0] // (40 / 16)),  # 40 angles -> 16 bins
    "smallnorb_azimuth": lambda f: int(f["label_azimuth"][0]),
    "smallnorb_elevation": lambda f: int(f["label_elevation"][0]),
}

_NAT, _SPE, _STR = GROUPS
TASKS: dict[str, Task] = {t.name: t for t in (
    Task("caltech101", "Caltech101", _NAT, 102, "caltech101:3.*.*", "train[:800]", "train[90%:+200]", "test"),
    Task("cifar100", "CIFAR-100", _NAT, 100, "cifar100:3.*.*", "train[:800]", "train[90%:+200]", "test"),
    Task("dtd", "DTD", _NAT, 47, "dtd:3.*.*", "train[:800]", "validation[:200]", "test"),
    Task("flowers102", "Flowers102", _NAT, 102, "oxford_flowers102:2.*.*", "train[:800]", "validation[:200]", "test"),
    Task("pets", "Pets", _NAT, 37, "oxford_iiit_pet:3.*.*", "train[:800]", "train[80%:+200]", "test"),
    Task("sun397", "Sun397", _NAT, 397, "sun397/tfds:4.*.*", "train[:800]", "validation[:200]", "test"),
    Task("svhn", "SVHN", _NAT, 10, "svhn_cropped:3.*.*", "train[:800]", "train[90%:+200]", "test"),
    Task("patch_camelyon", "Camelyon", _SPE, 2, "patch_camelyon:2.*.*", "train[:800]", "validation[:200]", "test"),
    Task("eurosat", "EuroSAT", _SPE, 10, "eurosat/rgb:2.*.*", "train[:800]", "train[60%:+200]", "train[80%:]"),
    Task("resisc45", "Resisc45", _SPE, 45, "resisc45:3.*.*", "train[:800]", "train[60%:+200]", "train[80%:]"),
    Task("retinopathy", "Retinopathy", _SPE, 5, "diabetic_retinopathy_detection/btgraham-300:3.*.*",
         "train[:800]", "validation[:200]", "test"),
    Task("clevr_count", "Clevr-Count", _STR, 8, "clevr:3.*.*", "train[:800]", "train[90%:+200]", "validation",
         "clevr_count"),
    Task("clevr_distance", "Clevr-Dist", _STR, 6, "clevr:3.*.*", "train[:800]", "train[90%:+200]", "validation",
         "clevr_distance"),
    Task("dmlab", "DMLab", _STR, 6, "dmlab:2.0.1", "train[:800]", "validation[:200]", "test"),
    Task("kitti_distance", "KITTI-Dist", _STR, 4, "kitti:3.1.0", "train[:800]", "validation[:200]", "test",
         "kitti_distance"),
    Task("dsprites_location", "dSpr-Loc", _STR, 16, "dsprites:2.*.*", "train[:800]", "train[80%:+200]",
         "train[90%:]", "dsprites_location", binary_pixels=True),
    Task("dsprites_orientation", "dSpr-Ori", _STR, 16, "dsprites:2.*.*", "train[:800]", "train[80%:+200]",
         "train[90%:]", "dsprites_orientation", binary_pixels=True),
    Task("smallnorb_azimuth", "sNORB-Azim", _STR, 18, "smallnorb:2.*.*", "train[:800]", "test[:200]", "test[50%:]",
         "smallnorb_azimuth"),
    Task("smallnorb_elevation", "sNORB-Elev", _STR, 9, "smallnorb:2.*.*", "train[:800]", "test[:200]", "test[50%:]",
         "smallnorb_elevation"),
)}

_SLICE = re.compile(r"^(\w+)(?:\[(-?\d+%?)?:(\+?\d+%?)?\])?$")


def _bound(text: str, n: int) -> int:
    return int(text[:-1]) * n // 100 if text.endswith("%") else int(text)


def resolve_slice(expr: str, sizes: dict[str, int]) -> tuple[str, int, int]:
    """A slice expression ("train[90%:+200]") on sources of `sizes` -> (split, start, stop).
    A slice that runs past its split's end is refused: VTAB's split would be short."""
    m = _SLICE.match(expr)
    if not m:
        raise ValueError(f"bad split slice {expr!r}")
    split, a, b = m.group(1), m.group(2) or "0", m.group(3)
    if split not in sizes:
        raise DataError(f"split {split!r} is missing (found: {', '.join(sorted(sizes)) or 'none'}); "
                        f"VTAB takes {expr} from it")
    n = sizes[split]
    start = _bound(a, n)
    stop = n if b is None else (start + int(b[1:]) if b.startswith("+") else _bound(b, n))
    if stop > n or start > stop:
        raise DataError(f"VTAB takes {expr} but the {split} split holds {n} examples ({start}:{stop} runs past its end)")
    return split, start, stop


def task_split(task: Task, split: str, sizes: dict[str, int]) -> list[tuple[str, int, int]]:
    """One VTAB-1k split of `task` ("train800", "val200", "train800val200" or "test") as a list
    of (source split, start, stop); only the slices it is made of are resolved."""
    slices = {"train800": [task.train800], "val200": [task.val200], "train800val200": [task.train800, task.val200],
              "test": [task.test]}[split]
    return [resolve_slice(s, sizes) for s in slices]


def task_splits(task: Task, sizes: dict[str, int]) -> dict[str, list[tuple[str, int, int]]]:
    """The four VTAB-1k splits of `task` as lists of (source split, start, stop)."""
    return {split: task_split(task, split, sizes) for split in ("train800", "val200", "train800val200", "test")}


def task_label(task: Task, features: dict[str, Any]) -> int:
    """The task's label of one source example (its flattened features)."""
    if task.label in LABELS:
        return LABELS[task.label](features)
    value = features[task.label]
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def get_task(name: str) -> Task:
    key = name.strip().lower().replace("-", "_")
    if key not in TASKS:
        raise DataError(suggest.unknown("VTAB task", name, TASKS, f"the {len(TASKS)} VTAB-1k tasks: {', '.join(TASKS)}"))
    return TASKS[key]


def group_sizes() -> dict[str, int]:
    return {g: sum(t.group == g for t in TASKS.values()) for g in GROUPS}


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)
