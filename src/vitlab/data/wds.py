"""WebDataset shards: tar files (.tar, .tar.gz) of samples `KEY.png`/`KEY.jpg` + `KEY.cls`,
read as a stream -- the format of data that outgrows one disk (ImageNet-21k, JFT-scale).

`wds:PATTERN` takes brace patterns (`train-{000000..000009}.tar.gz`), globs, or a folder
holding `train-*.tar*` and `test-*.tar*` (or `val-*`) shards.

Order and splitting. Every process reads the same stream: shards in an order shuffled per
epoch, then a shuffle buffer of encoded samples, both seeded by (seed, epoch). Position p of
that stream belongs to global batch p // G (G = global batch), and within it to process
(p % G) // b (b = per-process batch): the same layout as the map-style sampler, so a run on
two processes sees exactly the samples of a one-process run. Data-loader workers take
whole batches in turn. Only the owner of a sample decodes it, and a resumed run skips
the batches it has done without decoding them. Each process decompresses every shard
(cheap next to image decoding), the price of exact, process-count-independent batches.
"""

from __future__ import annotations

import copy
import json
import random
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from vitlab.config.run import SHUFFLE_BUFFER
from vitlab.data import remote
from vitlab.data.datasets import BadImageError, BatchLayout, DataError, Encoded, Skipped, apply_seeded, data_cache, item_seed
from vitlab.data.decode import stack_images
from vitlab.data.identity import dev_fraction as identity_dev_fraction, recognise, summed
from vitlab.data.images import read_image
from vitlab.data.tar_shards import iter_shard, resolve_shards
from vitlab.files import atomic_write_text
from vitlab.files.documents import read_json

IMAGE_KEYS = ("png", "jpg", "jpeg", "webp", "ppm", "bmp", "tif", "tiff")
LABEL_KEYS = ("cls", "cls.txt", "label")
DEV_BUCKETS = 1000
# A view that keeps part of its shards' samples (a dev split, a class-balanced training
# subset) must read every shard whole on each pass to find them: 3.3 s of tar parsing for
# CIFAR-10's 50,000 training samples, paid per epoch and per dev evaluation. Such a view
# holds its samples' encoded bytes in memory after the first pass, up to this many bytes
# (beyond it, it streams as before); later passes read no shard.
HOLD_BYTES = 256 * 2**20


def sample_label(path: remote.Shard, key: str, parts: dict[str, bytes]) -> int:
    for k in LABEL_KEYS:
        if k in parts:
            try:
                return int(parts[k].decode().strip())
            except ValueError:
                raise DataError(f"wds: {path}: sample {key} has a label that is not an integer: {parts[k][:20]!r}") from None
    raise DataError(f"wds: {path}: sample {key} has no label ({', '.join('.' + k for k in LABEL_KEYS)})")


def dev_bucket(key: str) -> int:
    return zlib.crc32(key.encode()) % DEV_BUCKETS


# A cached shard index, as read back (files.documents): anything else is indexed afresh.
INDEX_SHAPE = {"buckets": [int], "min_label": int, "max_label": int, "label_counts": [int]}


def _cached(path: remote.Shard, name: str, shape: object, read: Callable[[], Any], valid: Callable[[Any], bool] = bool) -> Any:
    """`read()` of a shard, cached on disk as wds-index/NAME (`{}` the shard's version: a file's
    path, size and modification time, a URL's ETag); a remote shard without a version, and a
    cached copy that is damaged or not `valid`, are read afresh."""
    tag = remote.shard_version(path)
    cache = data_cache() / "wds-index" / name.format(tag)
    if tag != "uncached":
        try:
            found = read_json(cache, shape, "shard index")
            if valid(found):
                return found
        except (OSError, ValueError):  # none yet, or damaged: read the shard again
            pass
    found = read()
    try:
        if tag != "uncached":
            atomic_write_text(cache, json.dumps(found))
    except OSError:
        pass  # a read-only home only costs a rescan
    return found


def shard_index(path: remote.Shard) -> dict[str, Any]:
    """Per shard: how many samples in each dev bucket, the smallest and largest label and
    the count of each label. Cached (`_cached`), so a stream knows its length (and what data
    it holds) without decoding an image."""
    # (an index of no samples, cached before an empty shard was refused, is read again: refused)
    return _cached(path, "{}.json", INDEX_SHAPE, lambda: _index(path), valid=lambda ix: sum(ix["buckets"]) > 0)


def _index(path: remote.Shard) -> dict[str, Any]:
    buckets = [0] * DEV_BUCKETS
    labels = []
    for key, parts in iter_shard(path):
        buckets[dev_bucket(key)] += 1
        labels.append(sample_label(path, key, parts))
    tally = Counter(labels)
    counts = [tally[label] for label in range(max(labels, default=-1) + 1)]
    return {"buckets": buckets, "min_label": min(labels, default=0), "max_label": max(labels, default=-1),
            "label_counts": counts}


def check_labels(shard: remote.Shard, index: dict[str, Any], num_classes: int) -> None:
    """Every label of the shard names a class: else the first sample that does not is named."""
    if index["min_label"] >= 0 and index["max_label"] < num_classes:
        return
    for key, parts in iter_shard(shard):
        label_error(shard, key, sample_label(shard, key, parts), num_classes)


def label_error(shard: remote.Shard, key: str, label: int, num_classes: int) -> None:
    if not 0 <= label < num_classes:
        raise DataError(f"wds: {shard}: sample {key} has label {label}, outside the {num_classes} classes (0 to {num_classes - 1}); "
                        "fix the shard's .cls files, or give the full class list (data.classes or a classes.txt beside the shards)")
def shard_labels(path: remote.Shard) -> tuple[list[str], list[int]]:
    """Every sample's key and label in one shard, in stream order; cached like `shard_index`
    (apart from it: only a training subset needs them)."""
    def read() -> dict[str, list]:
        samples = [(key, sample_label(path, key, parts)) for key, parts in iter_shard(path)]
        return {"keys": [k for k, _ in samples], "labels": [y for _, y in samples]}

    d = _cached(path, "labels-{}.labels.json", {"keys": [str], "labels": [int]}, read,
                lambda d: len(d["keys"]) == len(d["labels"]))
    return d["keys"], d["labels"]


def read_class_names(shards: Sequence[remote.Shard], classes: Any, max_label: int) -> list[str]:
    def lines(path: Path) -> list[str]:
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]

    if classes:
        if isinstance(classes, (list, tuple)):
            return [str(c) for c in classes]
        return lines(Path(str(classes))) if Path(str(classes)).is_file() else [c.strip() for c in str(classes).split(",")]
    if isinstance(shards[0], remote.RemoteShard):
        found = remote.classes_beside(shards[0]) or None  # none, or an empty list: numbered
    else:
        beside = shards[0].parent / "classes.txt"
        found = lines(beside) if beside.is_file() else None
    return found if found is not None else [str(i) for i in range(max_label + 1)]


class WebDataset(torch.utils.data.IterableDataset):
    """A stream of (image tensor, label) from tar shards; see the module docstring."""

    def __init__(self, pattern: str, split: str, transform: Callable, train: bool = False, seed: int = 0,
                 shuffle_buffer: int = SHUFFLE_BUFFER, skip_bad_images: bool = False, dev_fraction: Optional[float] = None,
                 classes: Any = None, rank: int = 0, world: int = 1, identity: Optional[str] = None):
        """`rank`/`world` split plain iteration across processes (the training loader's batches
        are laid out by `batches`, which is told them per call). `identity` declares which
        paper dataset the shards hold; without it the shards' class counts tell (see
        identity.py). `dev_fraction` None: the paper's share for that dataset, else 10%."""
        super().__init__()
        self.rank, self.world = rank, world
        self.shards = resolve_shards(pattern, split)
        self.transform = transform
        self.train = train
        self.seed = seed
        self.buffer_size = shuffle_buffer  # what a training view shuffles in
        self.shuffle_buffer = shuffle_buffer if train else 0
        self.skip_bad_images = skip_bad_images
        self.subset = {"dev": "dev", "train-minus-dev": "rest"}.get(split)
        self.only: Optional[frozenset[str]] = None  # a training subset's keys (see `restrict`)
        self.held: Optional[dict[remote.Shard, list]] = None  # a view's samples per shard, once read (see `hold`)
        self.too_large_to_hold = False
        self.bad_images = 0
        indexes = [shard_index(s) for s in self.shards]
        train_side = split in ("train", "dev", "train-minus-dev")
        self.identity = identity or (recognise(summed(ix["label_counts"] for ix in indexes)) if train_side else None)
        self.dev_cut = round(identity_dev_fraction(self.identity, dev_fraction) * DEV_BUCKETS)
        self.num_samples = sum(sum(self._counted(ix["buckets"])) for ix in indexes)
        self.class_names = read_class_names(self.shards, classes, max(ix["max_label"] for ix in indexes))
        for shard, ix in zip(self.shards, indexes, strict=True):
            check_labels(shard, ix, len(self.class_names))

    def _counted(self, buckets: list[int]) -> list[int]:
        if self.subset == "dev":
            return buckets[: self.dev_cut]
        if self.subset == "rest":
            return buckets[self.dev_cut :]
        return buckets

    def _keep(self, key: str) -> bool:
        if self.only is not None and key not in self.only:
            return False
        if self.subset is None:
            return True
        return (dev_bucket(key) < self.dev_cut) == (self.subset == "dev")

    def keys_and_labels(self) -> tuple[list[str], list[int]]:
        """Key and label of every sample of this split (a scan of the labels, no decoding)."""
        keys, labels = [], []
        for shard in self.shards:
            for key, label in zip(*shard_labels(shard), strict=True):
                if self._keep(key):
                    keys.append(key)
                    labels.append(label)
        return keys, labels

    def restrict(self, keys: set[str]) -> "WebDataset":
        """A view of the samples with these keys only (a training subset), same order and seeds."""
        view = copy.copy(self)
        view.only = frozenset(keys)
        view.num_samples = len(view.only)
        view.held, view.too_large_to_hold = None, False
        return view

    def view(self, transform: Callable, *, seed: int = 0, train: bool = False) -> "WebDataset":
        """The same shards and split through another transform, seed and mode (a training
        stream shuffles, an evaluation pass does not), sharing the index and any held samples."""
        out = copy.copy(self)
        out.transform, out.seed, out.train = transform, seed, train
        out.shuffle_buffer = self.buffer_size if train else 0
        return out

    def hold(self) -> None:
        """Read the shards once and keep this view's samples (see HOLD_BYTES): only for a view
        that keeps part of its shards (dev, train-minus-dev, a subset), where a pass reads
        every shard whatever it keeps. Called before a loader starts its workers, so they
        inherit the samples; a pass over held samples is the same stream, sample for sample."""
        if self.held is not None or self.too_large_to_hold or (self.only is None and self.subset is None):
            return
        held, size = {}, 0
        for shard in self.shards:
            kept = []
            for key, parts in iter_shard(shard):
                if self._keep(key):
                    kept.append((key, parts))
                    size += sum(len(v) for v in parts.values())
                    if size > HOLD_BYTES:  # every pass streams, as a whole split does
                        self.too_large_to_hold = True
                        return
            held[shard] = kept
        self.held = held

    def _samples(self, shard: remote.Shard) -> Iterator[tuple[str, dict[str, bytes]]]:
        """A shard's samples this view keeps, in tar order."""
        if self.held is not None:
            yield from self.held[shard]
            return
        for key, parts in iter_shard(shard):
            if self._keep(key):
                yield key, parts

    def __len__(self) -> int:
        return self.num_samples

    # The stream ---------------------------------------------------------------------------
    def encoded(self, epoch: int) -> Iterator[tuple[remote.Shard, str, dict[str, bytes]]]:
        """Every process's common stream of still-encoded samples for `epoch`."""
        self.hold()
        rng = random.Random(item_seed(self.seed, epoch, "wds-order"))
        shards = list(self.shards)
        if self.train:
            rng.shuffle(shards)
        buffer: list = []
        for shard in shards:
            for key, parts in self._samples(shard):
                if self.shuffle_buffer <= 1:
                    yield shard, key, parts
                    continue
                buffer.append((shard, key, parts))
                if len(buffer) >= self.shuffle_buffer:
                    i = rng.randrange(len(buffer))
                    buffer[i], buffer[-1] = buffer[-1], buffer[i]
                    yield buffer.pop()
        rng.shuffle(buffer)
        yield from buffer

    def decode(self, shard: remote.Shard, key: str, parts: dict[str, bytes], epoch: int) -> tuple[torch.Tensor, int] | Skipped:
        label = sample_label(shard, key, parts)
        label_error(shard, key, label, len(self.class_names))  # a shard changed since it was indexed
        data = next((parts[k] for k in IMAGE_KEYS if k in parts), None)
        seed = item_seed(self.seed, epoch, key) if self.train else None
        name = f"{shard}: sample {key}"
        try:
            if data is None:
                raise BadImageError(f"{name}: cannot read the image (no image member: {', '.join('.' + k for k in IMAGE_KEYS)}"
                                    "); fix the shard, or pass --skip-bad-images to skip and count such samples")
            # a transform that decodes only what its crop needs takes it encoded; else data/images.py decodes it
            image = Encoded(data, name) if getattr(self.transform, "takes_encoded", False) else read_image(data, name)
            return apply_seeded(self.transform, image, seed), label
        except BadImageError:
            if self.skip_bad_images:
                return Skipped(f"{shard}:{key}")
            raise

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        """Plain iteration: samples split across data-loader workers and processes."""
        info = torch.utils.data.get_worker_info()
        w, nw = (info.id, info.num_workers) if info else (0, 1)
        slot, stride = self.rank * nw + w, self.world * nw
        for p, (shard, key, parts) in enumerate(self.encoded(0)):
            if p % stride == slot:
                item = self.decode(shard, key, parts, 0)
                if isinstance(item, Skipped):
                    self.bad_images += 1
                else:
                    yield item

    def batches(self, **layout: Any) -> "WebDatasetBatches":
        self.hold()  # here, in the process that starts the loader's workers: each inherits it
        return WebDatasetBatches(self, **layout)


class WebDatasetBatches(BatchLayout, torch.utils.data.IterableDataset):
    """Collated batches (images, labels, skipped names) of one process, for DataLoader(batch_size=None).

    train: global steps [start_step, start_step + num_steps), crossing epochs. Global batch j
    of an epoch is stream positions [j*G, (j+1)*G), this process's part
    [j*G + rank*b, j*G + (rank+1)*b); the incomplete last global batch is dropped.
    eval: one pass; positions p with p % world == rank, in batches of b.
    Worker w of W makes the batches w, w + W, ... (counted from the first), the order in
    which DataLoader collects them.
    """

    def __init__(self, data: WebDataset, batch_size: int, rank: int = 0, world: int = 1, start_step: int = 0,
                 num_steps: Optional[int] = None, train: bool = True):
        super().__init__(data.num_samples, batch_size, rank, world, start_step, num_steps, train)
        self.data = data

    def _place(self, p: int) -> Optional[int]:
        """The batch of this process (within the epoch) that stream position p belongs to."""
        if self.train:
            j, within = divmod(p, self.b * self.world)
            return j if within // self.b == self.rank else None
        if p % self.world != self.rank:
            return None
        return (p // self.world) // self.b

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]]:
        info = torch.utils.data.get_worker_info()
        w, nw = (info.id, info.num_workers) if info else (0, 1)
        if not self.train:
            yield from self._epoch(0, 0, len(self), 0, w, nw)
            return
        step, end = self.start, self.start + self.num_steps
        while step < end:
            epoch, j = divmod(step, self.per_epoch)
            last = min(self.per_epoch, j + end - step)
            yield from self._epoch(epoch, j, last, step - self.start, w, nw)
            step += last - j

    def _epoch(self, epoch: int, first: int, last: int, counted: int, w: int, nw: int):
        """Batches [first, last) of one epoch; `counted` batches came before in this loader."""
        current, items, bad = None, [], []
        for p, (shard, key, parts) in enumerate(self.data.encoded(epoch)):
            j = self._place(p)
            if j is None or j < first or (counted + j - first) % nw != w:
                continue
            if j >= last:
                break
            if current is not None and j != current:
                yield stack_images(items, tuple(bad))
                items, bad = [], []
            current = j
            item = self.data.decode(shard, key, parts, epoch)
            if isinstance(item, Skipped):
                bad.append(str(item))
            else:
                items.append(item)
        if current is not None:
            yield stack_images(items, tuple(bad))
