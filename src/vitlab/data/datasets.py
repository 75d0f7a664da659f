"""Datasets by name: digits, Fashion-MNIST, CIFAR-10/100, image folders (map-style).

Every dataset here yields `(image, label)` with the image a normalised float tensor (C, H, W)
and carries `class_names`. Items can be asked for by index, or by `(index, seed)`: the seed
fixes the random augmentation of that one item, which is how a run gets the same pixels
whichever data-loader worker or process reads it, and after a resume.

Splits: "train", "test" (alias "val"), and a dev split carved from the training set with a
fixed seed, as the paper's fine-tuning protocol holds out 2% of CIFAR and 10% of other sets
to choose the learning rate (Appendix B.1.1): "dev" and "train-minus-dev".
"""

from __future__ import annotations

import copy
import gzip
import os
import struct
import warnings
import zlib
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence, TypeVar, Union

import numpy as np
import torch
from PIL import Image

from vitlab.config.fields import Reasoned
from vitlab.data import cifar
from vitlab.data.images import BadImageError, bad_image, decoded, read_image  # noqa: F401  (the one opener)
from vitlab.files import atomic_write_bytes, cache_dir, net

# The dev split is always drawn with this seed, independent of the run's seed, so that every
# run of a learning-rate sweep holds out the same images.
DEV_SPLIT_SEED = 2020
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
FASHION_MNIST_URL = "https://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FASHION_MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"), "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


class DataError(Reasoned, FileNotFoundError):
    """A dataset that cannot be found or read; the message says where it looked and the fix."""


class Encoded(NamedTuple):
    """An image not yet decoded (a file's path or its bytes, and a name for messages): what
    a dataset hands a transform that decodes for itself (`takes_encoded`, see decode.py), so
    that it can decode only what its crop needs."""

    source: Union[str, os.PathLike, bytes]
    name: str


class Skipped(str):
    """What an unreadable item becomes with skip_bad_images: its name (a file, a shard and
    key), so that a run counts each bad file once however many epochs meet it."""


def data_cache() -> Path:
    """Where downloaded datasets and shard indexes go: $VITLAB_DATA, else vitlab's cache."""
    return Path(os.environ["VITLAB_DATA"]) if os.environ.get("VITLAB_DATA") else cache_dir("data")


def item_seed(seed: int, epoch: int, key: int | str) -> int:
    """The augmentation seed of one item: a hash of (run seed, epoch, the item's identity)."""
    return zlib.crc32(f"{seed}/{epoch}/{key}".encode()) & 0x7FFFFFFF


def apply_seeded(transform: Callable, image: Any, seed: Optional[int]) -> torch.Tensor:
    """Run `transform` with torch's CPU generator seeded for this item, then put it back."""
    if seed is None:
        return transform(image)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return transform(image)


class BatchLayout:
    """Where one process's batches lie (data/loader.py's docstring): for training, the global
    steps [start_step, start_step + num_steps), crossing epochs (default: to the end of that
    epoch), `per_epoch` full global batches an epoch; for evaluation, one pass over every
    world-th item. The map-style sampler and the WebDataset stream share it."""

    def __init__(self, n: int, batch_size: int, rank: int = 0, world: int = 1, start_step: int = 0,
                 num_steps: Optional[int] = None, train: bool = True):
        self.n, self.b, self.rank, self.world, self.start, self.train = n, batch_size, rank, world, start_step, train
        self.per_epoch = n // (batch_size * world)
        self.num_steps = self.per_epoch - start_step % max(self.per_epoch, 1) if num_steps is None else num_steps

    def __len__(self) -> int:
        if self.train:
            return self.num_steps
        mine = (self.n - self.rank + self.world - 1) // self.world
        return (mine + self.b - 1) // self.b


def dev_split(n: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(dev, rest) indices of a training set of size n, by a fixed seed."""
    order = np.random.default_rng(DEV_SPLIT_SEED).permutation(n)
    k = max(1, int(round(n * fraction)))
    return np.sort(order[:k]), np.sort(order[k:])


_D = TypeVar("_D", bound="ImageDataset")


class ImageDataset(torch.utils.data.Dataset):
    """Base of the map-style sets: subclasses implement `_load(i) -> PIL image` and `_name(i)`."""

    def __init__(self, labels: np.ndarray, class_names: list[str], transform: Callable, seed: int = 0,
                 skip_bad_images: bool = False, indices: Optional[np.ndarray] = None):
        self.all_labels = np.asarray(labels, dtype=np.int64)
        self.class_names = list(class_names)
        self.transform = transform
        self.seed = seed
        self.skip_bad_images = skip_bad_images
        self.indices = np.arange(len(self.all_labels)) if indices is None else np.asarray(indices)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def labels(self) -> np.ndarray:
        return self.all_labels[self.indices]

    def select(self: _D, indices: np.ndarray) -> _D:
        """A view on some of the items (positions in this dataset), sharing the storage."""
        view = copy.copy(self)
        view.indices = self.indices[np.asarray(indices)]
        return view

    def view(self, transform: Callable, *, seed: int = 0, train: bool = False) -> "ImageDataset":
        """The same items through another transform and augmentation seed, sharing the storage
        (nothing is read again); `train` is the loader's business for a map-style set."""
        out = copy.copy(self)
        out.transform, out.seed = transform, seed
        return out

    def _load(self, i: int) -> Image.Image:
        raise NotImplementedError

    def _name(self, i: int) -> str:
        return f"item {i}"

    def __getitem__(self, key: int | tuple[int, int]):
        index, seed = key if isinstance(key, tuple) else (key, item_seed(self.seed, 0, key))
        i = int(self.indices[index])
        try:  # a transform that takes the encoded image decodes it itself, and may fail there
            image = self._encoded(i) if getattr(self.transform, "takes_encoded", False) else self._load(i)
            return apply_seeded(self.transform, image, seed), int(self.all_labels[i])
        except BadImageError:
            if self.skip_bad_images:
                return Skipped(self._name(i))  # dropped by the collate function, which names it
            raise

    def _encoded(self, i: int) -> Any:
        """The item before decoding, where the set holds files; decoded (a PIL image) otherwise."""
        return self._load(i)


class ArrayDataset(ImageDataset):
    """Images held in memory as a uint8 array (N, H, W) or (N, H, W, C)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, class_names: list[str], transform: Callable, **kw: Any):
        super().__init__(labels, class_names, transform, **kw)
        self.images = images

    def _load(self, i: int) -> Image.Image:
        return Image.fromarray(self.images[i])


class FileDataset(ImageDataset):
    """One image file per item (ImageFolder)."""

    def __init__(self, files: Sequence[Path], labels: np.ndarray, class_names: list[str], transform: Callable, **kw: Any):
        super().__init__(labels, class_names, transform, **kw)
        self.files = list(files)

    def _load(self, i: int) -> Image.Image:
        return read_image(self.files[i])

    def _encoded(self, i: int) -> Encoded:
        return Encoded(self.files[i], str(self.files[i]))

    def _name(self, i: int) -> str:
        return str(self.files[i])


# Sources ---------------------------------------------------------------------------------
def digits_arrays(split_seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """scikit-learn's 8x8 digits (1,797 images, 0-16 scaled to 0-255), shipped in the package.

    The set has no test split; a fixed 20% (360 images) is held out as "test".
    """
    with np.load(Path(__file__).with_name("digits.npz")) as f:
        images, labels = f["images"], f["labels"].astype(np.int64)
    order = np.random.default_rng(split_seed).permutation(len(labels))
    test, train = np.sort(order[:360]), np.sort(order[360:])
    return {"train": (images[train], labels[train]), "test": (images[test], labels[test])}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format), gzipped or not: big-endian dims, then uint8 data.

    Written here rather than taken from torchvision on purpose: torchvision.datasets.
    FashionMNIST (and its read_image_file) reads only the uncompressed files, and only under
    ROOT/FashionMNIST/raw/. Debian's dataset-fashion-mnist, the copy vitlab looks for first,
    is the four gzipped files in one flat folder, which torchvision would need decompressed
    into a second, 55 MB copy. tests/test_data.py checks that this reader gives torchvision's
    arrays on the real files."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise DataError(f"{path}: not an IDX file of unsigned bytes (header {data[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != int(np.prod(dims)):
        raise DataError(f"{path}: truncated IDX file ({array.size} bytes of {int(np.prod(dims))})")
    return array.reshape(dims)


def _find_idx(folder: Path, stem: str) -> Optional[Path]:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def download_fashion_mnist(folder: Path, mirror: str = FASHION_MNIST_URL, timeout: float = 20.0) -> None:
    """Fetch the four IDX files into `folder` (used only when no local copy exists)."""
    folder.mkdir(parents=True, exist_ok=True)
    for stems in FASHION_MNIST_FILES.values():
        for stem in stems:
            target = folder / f"{stem}.gz"
            if target.exists():
                continue
            with net.open_url(mirror + f"{stem}.gz", timeout, net.MIN_RATE) as r:
                atomic_write_bytes(target, r.read())


def fashion_mnist_arrays(folder: Optional[str], download: bool = True, mirror: str = FASHION_MNIST_URL) -> dict:
    candidates = [Path(folder)] if folder else [DEBIAN_FASHION_MNIST, data_cache() / "fashion-mnist"]
    for c in candidates:
        if _find_idx(c, FASHION_MNIST_FILES["train"][0]):
            break
    else:
        looked = ", ".join(str(c) for c in candidates)
        if folder or not download:
            raise DataError(f"Fashion-MNIST IDX files (train-images-idx3-ubyte[.gz], ...) not found in {looked}; "
                            "install Debian's dataset-fashion-mnist or pass fashion-mnist:FOLDER")
        c = data_cache() / "fashion-mnist"
        try:
            download_fashion_mnist(c, mirror)
        except OSError as e:
            raise DataError(f"Fashion-MNIST not found in {looked} and the download from {mirror} failed ({e}); "
                            "apt-get install dataset-fashion-mnist, or pass fashion-mnist:FOLDER") from None
    out = {}
    for split, (img_stem, lbl_stem) in FASHION_MNIST_FILES.items():
        img, lbl = _find_idx(c, img_stem), _find_idx(c, lbl_stem)
        if img is None or lbl is None:
            raise DataError(f"{c}: {img_stem} or {lbl_stem} (optionally .gz) is missing")
        out[split] = (read_idx(img), read_idx(lbl).astype(np.int64))
    return out


def cifar_arrays(kind: str, folder: Optional[str], download: bool = True) -> tuple[dict, list[str]]:
    """CIFAR-10/100 in the python distribution (cifar-10-batches-py / cifar-100-python),
    read by vitlab.data.cifar's restricted unpickler: nothing in the files is ever run.
    Downloaded (MD5-checked) into the data cache when absent, no FOLDER is given and allowed."""
    root, batches = cifar.find_folder(kind, folder, data_cache())
    if not batches.is_dir():
        if folder or not download:
            raise DataError(f"{kind}: no {batches.name} folder in {root}; pass {kind}:FOLDER holding the python version "
                            f"of {kind} ({batches.name}, or the folder itself)")
        try:
            cifar.download(kind, root)
        except OSError as e:
            raise DataError(f"{kind}: not found in {root} and the download failed ({e}); copy {batches.name} there "
                            f"or pass {kind}:FOLDER") from None
    return cifar.read_cifar(kind, batches, DataError)


def scan_image_folder(root: Path, class_names: Optional[list[str]] = None) -> tuple[list[Path], np.ndarray, list[str]]:
    """One sub-folder per class; files with image extensions, sorted for a stable order.

    When the classes are found here (no `class_names`), a class folder without images is
    refused: it would become a class the model is trained to predict and never sees. A
    held-out split read with the training set's classes may lack some; that is said, once."""
    discovering = class_names is None
    if class_names is None:
        class_names = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_names:
        raise DataError(f"{root}: no class sub-folders; imagefolder:PATH wants PATH/CLASS/IMAGE files")
    files, labels, empty = [], [], []
    for label, name in enumerate(class_names):
        folder = root / name
        found = sorted(f for f in folder.rglob("*") if f.suffix.lower() in IMAGE_EXTENSIONS and f.is_file()) \
            if folder.is_dir() else []
        if not found:
            empty.append(name)
        files += found
        labels += [label] * len(found)
    if not files:
        raise DataError(f"{root}: no image files ({', '.join(IMAGE_EXTENSIONS)}) under the class folders")
    if empty and discovering:
        raise DataError(f"{root}: the class folder(s) {', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''} hold no image files "
                        f"({', '.join(IMAGE_EXTENSIONS)}); add images or remove the folder(s)")
    if empty:
        warnings.warn(f"{root}: no images of the class(es) {', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''} "
                      "in this split; their accuracy cannot be measured here", stacklevel=2)
    return files, np.asarray(labels, dtype=np.int64), class_names


def image_folder(path: str, split: str, transform: Callable, test_fraction: float = 0.2, **kw: Any) -> FileDataset:
    """PATH/train + PATH/val (or PATH/test), or PATH/CLASS/... with `test_fraction` held out."""
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"imagefolder: {root} is not a folder")
    if (root / "train").is_dir():
        files, labels, class_names = scan_image_folder(root / "train")
        if split != "train":
            held = next((root / n for n in ("val", "test") if (root / n).is_dir()), None)
            if held is None:
                raise DataError(f"imagefolder: {root} has train/ but neither val/ nor test/")
            files, labels, _ = scan_image_folder(held, class_names)
        return FileDataset(files, labels, class_names, transform, **kw)
    files, labels, class_names = scan_image_folder(root)
    full = FileDataset(files, labels, class_names, transform, **kw)
    test, train = dev_split(len(files), test_fraction)
    return full.select(train if split == "train" else test)
