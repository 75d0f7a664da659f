"""`vitlab eval`: the JSON the docs promise (confusion matrix and class names included),
--format and --random-init like the other evaluation commands, --device checked, and a bad
image named in one line without the internal class path."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from conftest import perturb, tiny_model
from vitlab.cli import main


@pytest.fixture
def folder(tmp_path):
    """A 10-class image folder with one file that is not an image."""
    rng = np.random.default_rng(0)
    for c in range(10):
        (tmp_path / "data" / f"c{c}").mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(tmp_path / "data" / f"c{c}" / f"{i}.png")
    (tmp_path / "data" / "c3" / "broken.png").write_bytes(b"not a png")
    return tmp_path / "data"


def test_json_has_the_confusion_matrix_and_class_names(digits_run, tmp_path, capsys):
    ckpt = digits_run / "checkpoints" / "last.safetensors"
    assert main(["eval", str(ckpt), "--data", "digits", "--json", "--out", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    confusion = np.array(result["confusion"])
    assert confusion.shape == (10, 10) and confusion.sum() == result["count"] == 360
    assert result["class_names"] == [str(i) for i in range(10)]
    assert np.trace(confusion) / confusion.sum() == pytest.approx(result["top1"])
    assert json.loads((tmp_path / "eval-test.json").read_text())["confusion"] == result["confusion"]


def test_format_and_random_init(digits_run, tmp_path, capsys):
    ckpt = digits_run / "checkpoints" / "last.safetensors"
    timm_file = tmp_path / "timm.safetensors"
    vitlab.save(vitlab.load(ckpt), timm_file, format="timm")
    results = {}
    for name, extra in (("vitlab", []), ("timm", ["--format", "timm"]), ("random", ["--random-init", "0"])):
        path = timm_file if name == "timm" else ckpt
        assert main(["eval", str(path), "--data", "digits", "--json", "--out", str(tmp_path / name), *extra]) == 0
        results[name] = json.loads(capsys.readouterr().out)
    assert results["timm"]["top1"] == results["vitlab"]["top1"]
    assert results["random"]["top1"] < results["vitlab"]["top1"] - 0.2  # the baseline: the shape, no training


def test_a_bad_image_is_one_line_without_the_class_path(tmp_path, folder, capsys):
    ckpt = tmp_path / "m.safetensors"
    vitlab.save(perturb(tiny_model(class_names=[f"c{i}" for i in range(10)])), ckpt)
    for workers in ("0", "1"):  # a worker process re-raises the error with its class path in front
        assert main(["eval", str(ckpt), "--data", f"imagefolder:{folder}", "--split", "train", "--workers", workers]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "broken.png: cannot read this image" in err
        assert "BadImageError" not in err and "vitlab.data" not in err
    assert main(["eval", str(ckpt), "--data", f"imagefolder:{folder}", "--split", "train", "--skip-bad-images",
                 "--out", str(tmp_path / "eval")]) == 0
    assert "skipped 1 unreadable images" in capsys.readouterr().out


def test_device_is_checked(tiny_checkpoint, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for command in (["eval", "--data", "digits"], ["fewshot", "--data", "digits"], ["linear-probe", "--data", "digits"],
                    ["inspect", "--images", "digits", "--out", "x"], ["predict", "x.png"]):
        assert main([command[0], str(tiny_checkpoint), *command[1:], "--device", "cuda"]) == 2, command
        err = capsys.readouterr().err
        assert "--device cuda: torch sees no CUDA GPU" in err and len(err.strip().splitlines()) == 1


def test_eval_on_cifar10_shards_prints_the_checkpoints_class_names(cifar_dir, tmp_path, capsys):
    """The shards carry class indices only (no classes.txt): the checkpoint's names label the
    per-class table, the JSON and the confusion matrix, as predict and serve show them."""
    from conftest import CIFAR_CLASSES, small_classifier

    ckpt = tmp_path / "run" / "checkpoints" / "last.safetensors"
    ckpt.parent.mkdir(parents=True)
    vitlab.save(small_classifier(), ckpt)
    assert main(["eval", str(ckpt), "--data", f"wds:{cifar_dir}/test-000000.tar.gz"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["class", "accuracy"])
    rows = [line.split()[0] for line in lines[header + 1:header + 11]]
    assert rows == CIFAR_CLASSES, out
    result = json.loads((tmp_path / "run" / "eval" / "eval-test.json").read_text())  # into the run folder
    assert result["class_names"] == CIFAR_CLASSES and list(result["per_class"]) == CIFAR_CLASSES


def test_eval_writes_nothing_into_the_current_folder_unasked(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    from conftest import unchanged

    monkeypatch.chdir(tmp_path)
    with unchanged(tmp_path):
        assert main(["eval", str(tiny_checkpoint), "--data", "digits"]) == 0
    out = capsys.readouterr().out
    assert "results not written" in out and "--out DIR" in out
    assert "0          " in out  # the checkpoint's names are placeholders ("class 0"): the data's label the rows


def test_class_names_rules():
    from vitlab.data import DataError
    from vitlab.eval.classes import class_names_for

    names = ["cat", "dog", "bird"]
    assert class_names_for(names, 3, ["0", "1", "2"]) == names  # indices take the checkpoint's names
    assert class_names_for(names, 3, ["0", "1"]) == names  # a split that lacks the last class
    assert class_names_for(None, 3, ["a", "b", "c"]) == ["a", "b", "c"]  # nothing to take
    assert class_names_for(["class 0", "class 1", "class 2"], 3, ["a", "b", "c"]) == ["a", "b", "c"]
    assert class_names_for(names, 3, names) == names
    with pytest.raises(DataError, match="'bird' is class 1 there, 2 in") as e:
        class_names_for(names, 3, ["cat", "bird", "dog"], "imagefolder:x")
    assert e.value.reason == "class-order"
    with pytest.warns(UserWarning, match="class 1: 'doggo' / 'dog'"):
        assert class_names_for(names, 3, ["cat", "doggo", "bird"]) == names
