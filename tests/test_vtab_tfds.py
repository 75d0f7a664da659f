"""VTAB-1k read from tfds folders written by tensorflow-datasets' own builders (tfds_fixtures.py,
built once per test session in a process of its own: no worker imports TensorFlow): the
pixel range VTAB feeds (dSprites' 0/1 times 255), the config and version VTAB pins (a
retinopathy folder with two configs, a pets folder with two versions), labels in tfds's own
stored order and VTAB's split sizes; and the TFRecord checksums."""

from __future__ import annotations

import shutil
import struct

import numpy as np
import pytest
import torch

from vitlab.data import DataError, open_dataset
from vitlab.data.tfrecord import Records
from vitlab.data.transforms import eval_transform
from vitlab.data.vtab import TASKS, task_label

pytest.importorskip("tensorflow_datasets")  # the test extra; its builders need TensorFlow (tensorflow-cpu)


def vtab(task, root, split, size=64, channels=1):
    return open_dataset(f"vtab:{task}:{root}", split, eval_transform(size, [0.5] * channels, [0.5] * channels, channels))


def test_dsprites_pixels_span_minus_one_to_one(tfds_root):
    """tfds stores dSprites as 0/1; VTAB multiplies by 255: the model sees -1..1, not -1..-0.992."""
    root, expected = tfds_root
    stored = expected["dsprites/2.0.0"]["train"]
    assert (stored["min"], stored["max"]) == (0, 1)  # what tfds itself reads back
    test = vtab("dsprites_location", root, "test")
    images = torch.stack([test[i][0] for i in range(0, len(test), 7)])
    assert images.min().item() == -1.0 and images.max().item() == 1.0
    # Label and image agree: the bar tfds_fixtures draws sits at column 2 * x_position, and
    # VTAB's location label is x_position // 2 (16 bins of 32 positions).
    for i in range(0, len(test), 37):
        image, label = test[i]
        bright = (image[0] > 0).any(0).nonzero().flatten()
        column = int(bright[0]) // 2  # 64 px read at 64: column = 2 * x
        assert column // 2 == label, (i, column, label)


def test_dsprites_and_smallnorb_labels_and_sizes_follow_tfds_order(tfds_root):
    root, expected = tfds_root
    x = expected["dsprites/2.0.0"]["train"]["labels"]  # label_x_position in tfds's stored order
    sizes = {"train": 1000, "train-minus-dev": 800, "dev": 200, "test": 100}
    for split, n in sizes.items():
        assert len(vtab("dsprites_location", root, split).labels) == n
    loc = vtab("dsprites_location", root, "train").labels.tolist()
    assert loc == [v // 2 for v in x[:800] + x[800:1000]]  # train[:800] + train[80%:+200]
    assert vtab("dsprites_location", root, "test").labels.tolist() == [v // 2 for v in x[900:]]
    azimuth = expected["smallnorb/2.0.0"]
    assert vtab("smallnorb_azimuth", root, "train-minus-dev").labels.tolist() == azimuth["train"]["labels"][:800]
    assert vtab("smallnorb_azimuth", root, "dev").labels.tolist() == azimuth["test"]["labels"][:200]
    assert vtab("smallnorb_azimuth", root, "test").labels.tolist() == azimuth["test"]["labels"][100:]
    image = vtab("smallnorb_elevation", root, "test", size=96, channels=3)[0][0]
    assert image.shape == (3, 96, 96) and torch.equal(image[0], image[2])  # grey tiled to RGB, as VTAB does


def test_retinopathy_reads_btgraham_300_beside_original(tfds_root):
    root, expected = tfds_root
    test = vtab("retinopathy", root, "test", size=32)
    assert test.where.endswith("diabetic_retinopathy_detection/btgraham-300/3.0.0")
    assert test.labels.tolist() == expected["diabetic_retinopathy_detection/btgraham-300/3.0.0"]["test"]["labels"]
    assert test._load(0).size == (540, 540)  # btgraham's crop (radius 300 * 0.9), not the original 160x120
    other = vtab("retinopathy@original/3.0.0", root, "test", size=32)  # accepted explicitly
    assert other.where.endswith("original/3.0.0") and other._load(0).size == (160, 120)
    alone = root.parent / "retino-original-only" / "diabetic_retinopathy_detection"
    shutil.copytree(root / "diabetic_retinopathy_detection" / "original", alone / "original", dirs_exist_ok=True)
    with pytest.raises(DataError, match=r"holds original:3\.0\.0; .*btgraham-300") as e:
        vtab("retinopathy", alone.parent, "test")
    assert e.value.reason == "version" and "\n" not in str(e.value) and "retinopathy@[CONFIG/]VERSION" in str(e.value)


def test_pets_reads_the_3x_version_vtab_pins(tfds_root):
    root, expected = tfds_root
    test = vtab("pets", root, "test")
    assert test.where.endswith("oxford_iiit_pet/3.2.0")  # not tfds's newer default 4.0.0
    assert test.labels.tolist() == expected["oxford_iiit_pet/3.2.0"]["test"]["labels"]
    assert vtab("pets@4.0.0", root, "test").where.endswith("oxford_iiit_pet/4.0.0")
    newer = root.parent / "pets-4-only" / "oxford_iiit_pet"
    shutil.copytree(root / "oxford_iiit_pet" / "4.0.0", newer / "4.0.0", dirs_exist_ok=True)
    with pytest.raises(DataError, match=r"holds 4\.0\.0; .*oxford_iiit_pet:3\.") as e:
        vtab("pets", newer.parent, "test")
    assert e.value.reason == "version"
    with pytest.raises(DataError, match="not the 5.0.0 the spec accepts"):
        vtab("pets@5.0.0", root, "test")


def test_a_flipped_byte_is_refused_by_its_checksum(tfds_root, tmp_path):
    """tfds writes masked CRC-32C of each record's length and data: a flipped byte in either is
    refused in one line, never read as another label."""
    root, _ = tfds_root
    shard = sorted((root / "smallnorb" / "2.0.0").glob("*-test.tfrecord-*"))[0]
    good = Records([shard])
    length = struct.unpack("<Q", shard.read_bytes()[:8])[0]
    for where, reading in ((3, "length"), (12 + length // 2, "data")):
        data = bytearray(shard.read_bytes())
        data[where] ^= 0x01
        bad = tmp_path / f"{reading}" / shard.name
        bad.parent.mkdir()
        bad.write_bytes(bytes(data))
        with pytest.raises(DataError, match=f"fails its {reading} checksum") as e:
            Records([bad])[0] if reading == "data" else Records([bad])
        assert e.value.reason == "checksum" and "\n" not in str(e.value)
    assert task_label(TASKS["smallnorb_azimuth"], good[0]) in range(18)


def test_a_source_without_the_label_feature_is_refused(tfds_root, tmp_path):
    """A folder of another dataset under a task's name: one line naming the missing feature
    (tfds and a datasets save_to_disk folder alike)."""
    datasets = pytest.importorskip("datasets")
    root, _ = tfds_root
    shutil.copytree(root / "smallnorb", tmp_path / "tfds" / "dsprites")  # smallnorb posing as dsprites
    with pytest.raises(DataError, match=r"'label_x_position'.*is this dsprites") as e:
        vtab("dsprites_location", tmp_path / "tfds", "test")
    assert e.value.reason == "no-feature"
    part = datasets.Dataset.from_dict({"image": [np.zeros((8, 8, 3), np.uint8)] * 4, "kind": [0, 1, 0, 1]})
    datasets.DatasetDict({"train": part, "validation": part, "test": part}).save_to_disk(str(tmp_path / "hf" / "dtd"))
    with pytest.raises(DataError, match=r"dtd .*no feature 'label'") as e:
        vtab("dtd", tmp_path / "hf", "test")
    assert "\n" not in str(e.value)
