"""ImageNet ReaL (eval/real.py, data/imagenet_val.py, `vitlab eval --real`): a constructed
mini validation set whose answers are known, in both layouts the ImageNet val set is kept in."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from conftest import perturb, tiny_model
from vitlab.cli import main
from vitlab.data import DataError, open_dataset
from vitlab.data.transforms import eval_transform
from vitlab.eval.real import read_real_labels, real_accuracy

WNIDS = ["n01440764", "n01443537", "n01484850", "n01491361", "n01494475"]


def test_real_accuracy_arithmetic():
    # image 0: hit; 1: miss; 2: left out (empty); 3: hit on a second label; 4: miss
    r = real_accuracy([3, 1, 0, 4, 2], [[3], [0, 2], [], [1, 4], [0]])
    assert r == {"real_top1": 2 / 4, "real_count": 4, "real_left_out": 1}
    assert real_accuracy([1], [[]])["real_top1"] is None


@pytest.fixture
def val_dir(tmp_path):
    """12 images named ILSVRC2012_val_000000NN.JPEG, spread over 5 wnid folders so that the
    folder order is not the file-name order."""
    rng = np.random.default_rng(0)
    root = tmp_path / "val"
    for i in range(1, 13):
        folder = root / WNIDS[(i * 3) % 5]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(folder / f"ILSVRC2012_val_{i:08d}.JPEG",
                                                                               quality=95)
    return root


def test_images_come_in_file_name_order(val_dir):
    ds = open_dataset(f"imagenet-val:{val_dir}", "test", eval_transform(16))
    assert [f.name for f in ds.files] == [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 13)]
    assert ds.class_names == WNIDS
    assert ds.labels.tolist() == [(i * 3) % 5 for i in range(1, 13)]
    with pytest.raises(DataError, match="one split"):
        open_dataset(f"imagenet-val:{val_dir}", "train", eval_transform(16))


def test_flat_layout_reads_labels_txt(val_dir, tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for f in sorted(val_dir.rglob("*.JPEG")):
        f.rename(flat / f.name)
    with pytest.raises(DataError, match="labels.txt"):
        open_dataset(f"imagenet-val:{flat}", "test", eval_transform(16))
    (flat / "labels.txt").write_text("\n".join(str(i % 7) for i in range(12)))
    ds = open_dataset(f"imagenet-val:{flat}", "test", eval_transform(16))
    assert ds.labels.tolist() == [i % 7 for i in range(12)] and len(ds.class_names) == 1000


def test_eval_real_on_a_constructed_set(val_dir, tmp_path, capsys):
    model = perturb(tiny_model(seed=3, class_names=WNIDS, num_classes=5))
    ckpt = tmp_path / "m.safetensors"
    vitlab.save(model, ckpt)
    # The model's own top-1 per image, in file-name order, computed here independently.
    ds = open_dataset(f"imagenet-val:{val_dir}", "test", vitlab.transform(model))
    with torch.no_grad():
        preds = [int(vitlab.load(ckpt).eval()(ds[i][0][None]).argmax()) for i in range(len(ds))]
    # ReaL lists built so the answer is known: 5 contain the prediction, 4 do not, 3 are empty.
    real = []
    for i, p in enumerate(preds):
        real.append([p, (p + 1) % 5] if i < 5 else ([(p + 2) % 5] if i < 9 else []))
    labels = tmp_path / "real.json"
    labels.write_text(json.dumps(real))
    assert main(["eval", str(ckpt), "--data", f"imagenet-val:{val_dir}", "--real", str(labels), "--json",
                 "--out", str(tmp_path / "out")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["real_top1"] == pytest.approx(5 / 9) and result["real_count"] == 9 and result["real_left_out"] == 3
    top1 = np.mean([p == y for p, y in zip(preds, ds.labels.tolist(), strict=True)])
    assert result["top1"] == pytest.approx(top1)  # ordinary top-1 beside it, from the folder labels
    assert main(["eval", str(ckpt), "--data", f"imagenet-val:{val_dir}", "--real", str(labels),
                 "--out", str(tmp_path / "out")]) == 0
    assert "ReaL top-1 55.56%" in capsys.readouterr().out
    # One list too few: the alignment with file names is broken, and said so.
    labels.write_text(json.dumps(real[:-1]))
    assert main(["eval", str(ckpt), "--data", f"imagenet-val:{val_dir}", "--real", str(labels)]) == 2
    assert "11 label lists for 12 images" in capsys.readouterr().err


def test_bad_real_files_are_one_line(tmp_path):
    bad = tmp_path / "real.json"
    bad.write_text('{"a": 1}')
    with pytest.raises(DataError, match="one list of class ids"):
        read_real_labels(bad, 1, 5)
    bad.write_text("[[7]]")
    with pytest.raises(DataError, match="from 0 to 4"):
        read_real_labels(bad, 1, 5)
    bad.write_text("[[1")
    with pytest.raises(DataError, match="not JSON"):
        read_real_labels(bad, 1, 5)
