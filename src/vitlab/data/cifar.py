"""CIFAR-10 and CIFAR-100 in their python distribution (cifar-10-batches-py, cifar-100-python),
read without running anything from the files.

The batches are pickles: a dict of `data` (a uint8 array, one 3x32x32 image per row, CHW),
`labels` (CIFAR-10) or `fine_labels` (CIFAR-100), and a few strings. Unpickling is a small
program that may call any importable function (`os.system` included), so the standard
`pickle.load` -- and torchvision's CIFAR classes, which use it -- would run whatever a crafted
batch file asks. `SafeUnpickler` resolves no name but the three numpy needs to rebuild an
array (`_reconstruct` or `_frombuffer`, `ndarray`, `dtype`); every other global, and persistent ids, are
refused before anything is called. What comes out is then checked: the right keys, a uint8
array of N x 3072, N integer labels in range.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import tarfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

from vitlab.files import net, require_regular_file

# The only globals a CIFAR batch names: numpy rebuilding its arrays (numpy 1 and 2 spellings).
ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),  # protocol 5 (an array re-pickled by Python 3.8+)
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}
MAX_BATCH_BYTES = 512 * 2**20  # the largest CIFAR file is 155 MB
LAYOUT: dict[str, dict[str, Any]] = {
    "cifar10": dict(folder="cifar-10-batches-py", train=[f"data_batch_{i}" for i in range(1, 6)], test=["test_batch"],
                    meta="batches.meta", names="label_names", labels="labels",
                    url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", md5="c58f30108f718f92721af3b95e74349a"),
    "cifar100": dict(folder="cifar-100-python", train=["train"], test=["test"], meta="meta", names="fine_label_names",
                     labels="fine_labels", url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
                     md5="eb9058c3a382ffc7106e4002c42a8d85"),
}


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle that asks for something a CIFAR batch never holds; nothing of it was run."""


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that can build dicts, lists, strings, bytes, numbers and numpy arrays,
    and nothing else: `find_class` is where every global (GLOBAL, STACK_GLOBAL, INST, OBJ,
    EXT*) is resolved, so a refusal there stops a crafted file before any call."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):
            return _latin1_bytes  # how protocols 0-2 of Python 3 spell a bytes object
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafePickleError(f"refused to load {module}.{name}: a CIFAR batch holds only arrays, lists and strings")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refused a persistent id: a CIFAR batch has none")


def _latin1_bytes(text: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(f"refused _codecs.encode(..., {encoding!r}): only latin1 bytes occur in a CIFAR batch")
    return text.encode("latin1")


def safe_load(path: Path, error: type[Exception]) -> Any:
    """Unpickle a CIFAR file with SafeUnpickler; `error(message)` for anything refused or broken."""
    require_regular_file(path, "CIFAR batch file")
    size = path.stat().st_size
    if size > MAX_BATCH_BYTES:
        raise error(f"{path}: {size / 2**20:.0f} MB, larger than any CIFAR batch; not read")
    data = path.read_bytes()
    try:
        return SafeUnpickler(io.BytesIO(data), encoding="latin1").load()
    except UnsafePickleError as e:
        raise error(f"{path}: {e}; the file is not a CIFAR batch (nothing in it was run)") from None
    except Exception as e:  # truncated or garbled: pickle raises many types
        raise error(f"{path}: not a readable CIFAR batch ({type(e).__name__}: {e})") from None


def _get(d: dict, key: str) -> Any:
    """CIFAR's keys are bytes in the original files (Python 2 pickles) and str in re-pickled ones."""
    for k in (key, key.encode()):
        if k in d:
            return d[k]
    return None


def read_batch(path: Path, labels_key: str, error: type[Exception]) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 32, 32, 3) uint8 HWC, labels (N,) int64) of one batch file."""
    d = safe_load(path, error)
    if not isinstance(d, dict):
        raise error(f"{path}: a CIFAR batch is a dict, this file holds a {type(d).__name__}")
    data, labels = _get(d, "data"), _get(d, labels_key)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        what = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise error(f"{path}: 'data' must be a uint8 array of N x 3072 pixels (3x32x32), found {what}")
    if not isinstance(labels, (list, np.ndarray)) or len(labels) != len(data):
        raise error(f"{path}: '{labels_key}' must list one label per image ({len(data)}), found {type(labels).__name__}")
    if not all(isinstance(y, (int, np.integer)) and not isinstance(y, bool) for y in labels):
        raise error(f"{path}: '{labels_key}' holds values that are not integers")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # the format's CHW rows -> HWC
    return np.ascontiguousarray(images), np.asarray(labels, dtype=np.int64)


def read_names(path: Path, key: str, error: type[Exception]) -> list[str]:
    d = safe_load(path, error)
    names = _get(d, key) if isinstance(d, dict) else None
    if not isinstance(names, list) or not all(isinstance(n, (str, bytes)) for n in names):
        raise error(f"{path}: no list of class names under {key!r}")
    return [n.decode("latin1") if isinstance(n, bytes) else n for n in names]


def read_cifar(kind: str, folder: Path, error: type[Exception]) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[str]]:
    """{"train": (images, labels), "test": ...} and the class names from `folder` (the
    batches folder itself)."""
    spec = LAYOUT[kind]
    names = read_names(folder / spec["meta"], spec["names"], error)
    out = {}
    for split in ("train", "test"):
        parts = [read_batch(folder / f, spec["labels"], error) for f in spec[split]]
        images = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
        if len(labels) and (labels.min() < 0 or labels.max() >= len(names)):
            raise error(f"{folder}: {split} labels run from {labels.min()} to {labels.max()}, "
                        f"but {folder / spec['meta']} names {len(names)} classes")
        out[split] = (images, labels)
    return out, names


def download(kind: str, root: Path, timeout: float = 30.0) -> None:
    """Fetch and unpack the official archive into `root`, checked against its published MD5;
    members are extracted with tarfile's "data" filter (no links out, no absolute paths)."""
    spec = LAYOUT[kind]
    with net.open_url(spec["url"], timeout, net.MIN_RATE) as r:
        blob = r.read()
    digest = hashlib.md5(blob).hexdigest()
    if digest != spec["md5"]:
        raise OSError(f"{spec['url']}: MD5 {digest}, expected {spec['md5']}: a damaged or altered download")
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tf:
        tf.extractall(root, filter="data")


def find_folder(kind: str, folder: Optional[str], cache: Path) -> tuple[Path, Path]:
    """(root, batches folder) for `cifar10:FOLDER`, where FOLDER holds the batches folder or is it."""
    spec = LAYOUT[kind]
    root = Path(folder).expanduser() if folder else cache
    if root.name == spec["folder"]:
        root = root.parent
    return root, root / spec["folder"]
