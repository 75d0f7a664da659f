"""Training subsets (data/subset.py): class-balanced, fixed by their seed alone, nested, the
same for a map-style set and a streamed one, and in the trainer (--train-fraction/--train-size)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from test_data import cifar_samples, write_shards
from vitlab.cli import main
from vitlab.config import ConfigError, DataConfig
from vitlab.data import DataError, make_loader, open_dataset, training_subset
from vitlab.data.subset import balanced_indices, class_quotas
from vitlab.data.transforms import eval_transform


def test_quotas_are_balanced_and_respect_small_classes():
    assert class_quotas(np.array([10, 10, 10]), 7, seed=0).tolist() in ([3, 2, 2], [2, 3, 2], [2, 2, 3])
    assert class_quotas(np.array([10, 10, 10]), 30, seed=0).tolist() == [10, 10, 10]
    q = class_quotas(np.array([3, 100, 100]), 50, seed=0)
    assert q[0] == 3 and q.sum() == 50 and abs(int(q[1]) - int(q[2])) <= 1


def test_subsets_are_fixed_nested_and_balanced():
    labels = np.repeat(np.arange(10), 500)[np.random.default_rng(1).permutation(5000)]
    small, large = balanced_indices(labels, 250, seed=0), balanced_indices(labels, 1500, seed=0)
    assert np.bincount(labels[small]).tolist() == [25] * 10
    assert set(small) <= set(large)  # 5% of the set is inside 30% of it, as 9M is inside 90M
    assert np.array_equal(small, balanced_indices(labels, 250, seed=0))
    assert not np.array_equal(small, balanced_indices(labels, 250, seed=1))
    assert np.all(np.diff(small) > 0)


def test_map_style_and_streamed_sets_give_the_same_subset(tmp_path):
    samples = cifar_samples(60)
    write_shards(tmp_path, samples, per_shard=20, gz=False)
    stream = open_dataset(f"wds:{tmp_path}/train-{{000000..000002}}.tar", "train", eval_transform(32))
    part = training_subset(stream, size=20, seed=0)
    assert len(part) == 20 and len(stream) == 60
    # The stream's subset is the same set of samples the map-style rule picks from its labels,
    # and streaming it yields exactly those.
    keys, labels = stream.keys_and_labels()
    chosen = balanced_indices(np.asarray(labels), 20, 0)
    assert {keys[i] for i in chosen} == set(part.only)
    assert sorted(y for _, y in part) == sorted(labels[i] for i in chosen)
    counts = np.bincount(np.asarray(labels)[chosen], minlength=10)
    assert counts.tolist() == class_quotas(np.bincount(labels, minlength=10), 20, 0).tolist()
    # Every process sees its share of the same subset.
    one = [b[1].tolist() for b in make_loader(part, 10, num_steps=2, seed=3)]
    two = [[b[1].tolist() for b in make_loader(part, 5, rank=r, world=2, num_steps=2, seed=3)] for r in (0, 1)]
    assert [a + b for a, b in zip(*two, strict=True)] == one


def test_digits_subset_by_fraction_and_size():
    train = open_dataset("digits", "train", eval_transform(8, (0.5,), (0.5,), 1))
    tenth = training_subset(train, fraction=0.1)
    assert len(tenth) == round(0.1 * len(train))
    assert np.bincount(tenth.labels).max() - np.bincount(tenth.labels).min() <= 1
    assert training_subset(train, size=len(train)) is train
    with pytest.raises(DataError, match="exceeds"):
        training_subset(train, size=len(train) + 1)
    with pytest.raises(ConfigError, match="set one of them"):
        DataConfig(train_fraction=0.5, train_size=100)


def test_the_trainer_trains_on_the_subset(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--steps", "2", "--batch-size", "16", "--train-size", "100", "--out", str(out),
            "model.hidden_size=32", "model.depth=1", "model.num_heads=2", "model.mlp_dim=32", "train.threads=1"]
    assert main(args) == 0
    assert "100 images" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["epochs"] == pytest.approx(2 / (100 // 16), abs=1e-3)
    assert "train_size: 100" in (out / "config.yaml").read_text()


def _batches(dataset, **layout):
    return [(images.clone(), labels.tolist()) for images, labels, _ in make_loader(dataset, **layout)]


def test_a_subset_reads_its_shards_once_and_streams_the_same_batches(tmp_path, monkeypatch):
    """A view that keeps part of its shards holds its samples after one read: every later
    epoch reads no shard, and each batch (augmentation included) is the streamed one's."""
    from vitlab.data import wds
    from vitlab.data.transforms import train_transform

    write_shards(tmp_path, cifar_samples(60), per_shard=20, gz=True)
    stream = open_dataset(f"wds:{tmp_path}/train-{{000000..000002}}.tar.gz", "train", train_transform(32), train=True)
    reads = []
    real = wds.iter_shard
    monkeypatch.setattr(wds, "iter_shard", lambda path: (reads.append(path), real(path))[1])
    held, streamed = training_subset(stream, size=20, seed=0), training_subset(stream, size=20, seed=0)
    reads.clear()
    layout = dict(batch_size=5, num_steps=12, seed=3)  # 3 epochs of 4 batches
    held_batches = _batches(held, **layout)
    assert len(reads) == 3 and held.held is not None  # each shard once, for all three epochs
    assert _equal(_batches(held, **layout), held_batches)
    assert len(reads) == 3  # a second loader over the held view reads nothing either

    monkeypatch.setattr(wds, "HOLD_BYTES", 0)  # too large to hold: it streams, reading per epoch
    reads.clear()
    streamed_batches = _batches(streamed, **layout)
    assert streamed.held is None and streamed.too_large_to_hold and len(reads) > 3
    assert _equal(held_batches, streamed_batches)


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(la == lb and torch.equal(xa, xb) for (xa, la), (xb, lb) in zip(a, b, strict=True))


def test_the_dev_split_is_read_once_across_evaluations(cifar_dir, monkeypatch):
    from vitlab.data import wds

    dev = open_dataset(f"wds:{cifar_dir}", "dev", eval_transform(32))
    reads = []
    real = wds.iter_shard
    monkeypatch.setattr(wds, "iter_shard", lambda path: (reads.append(path), real(path))[1])
    first = _batches(dev, batch_size=256, train=False, num_workers=1)
    shards = len(reads)
    second = _batches(dev, batch_size=256, train=False, num_workers=1)
    assert shards == len(dev.shards) and len(reads) == shards  # the second evaluation read no shard
    assert _equal(first, second) and sum(len(labels) for _, labels in first) == len(dev) == 1026
