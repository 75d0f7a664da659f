"""VTAB-1k's geometry on the images its tasks have: task_adaptation resizes the whole image to
the square for training and for evaluation. Each source form vtab_sources.py reads (image
folders, a datasets save_to_disk folder, a tfds data_dir) is written here with non-square
images at the task's real shape (KITTI 375x1242, CLEVR 320x480, DMLab 360x480, the natural
tasks' typical photos), each with a red band on its left tenth and a blue band on its right
tenth; the run `vitlab vtab` configures (train/vtab.task_config, opened by train/build.py as
the trainer opens it) must keep a tenth of each in its training images, on both CPU decode
paths, and in its evaluation images."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from tfrecord_writer import write_example, write_records
from vitlab.config import ViTConfig
from vitlab.data.vtab import TASKS, resolve_slice
from vitlab.train import build, vtab
from vitlab.train.inputs import Inputs

# (height, width) of each non-square task's images: the fixed shapes of the structured sources,
# and a typical photo of each natural source (theirs vary image by image).
SHAPES = {"kitti_distance": (375, 1242), "clevr_count": (320, 480), "clevr_distance": (320, 480),
          "dmlab": (360, 480), "caltech101": (200, 300), "dtd": (480, 640), "flowers102": (500, 667),
          "pets": (375, 500), "sun397": (300, 400)}
FORMS = ("folders", "datasets", "tfds")
# Every form at KITTI's, CLEVR's and DMLab's shapes; each other task in one form.
CASES = [(t, f) for t in ("kitti_distance", "clevr_count", "dmlab") for f in FORMS] + [
    (t, FORMS[k % 3]) for k, t in enumerate(("clevr_distance", "caltech101", "dtd", "flowers102", "pets", "sun397"))]


def marked(height: int, width: int) -> bytes:
    """A grey PNG with a red band on its left tenth and a blue band on its right tenth."""
    a = np.full((height, width, 3), 128, np.uint8)
    band = width // 10
    a[:, :band] = (255, 0, 0)
    a[:, width - band:] = (0, 0, 255)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def sizes(task) -> dict[str, int]:
    """The smallest source splits every VTAB slice of `task` fits in (4 at least)."""
    slices = [task.train800, task.val200, task.test]
    names = {s.split("[")[0] for s in slices}
    out = {}
    for name in names:
        mine = [s for s in slices if s.split("[")[0] == name]
        n = 4
        while True:
            try:
                [resolve_slice(s, {name: n}) for s in mine]
                break
            except Exception:
                n += 1
        out[name] = n
    return out


def features(task) -> dict:
    """A source example's features from which VTAB derives a label in range."""
    if task.source == "kitti":
        return {"objects": {"location": [[0.0, 1.0, 12.0]], "type": [0]}}
    if task.source == "clevr":
        return {"objects": {"size": [0, 1, 0, 1], "pixel_coords": [[10.0, 20.0, 9.2]] * 4}}
    return {"label": 1}


def write(task, form: str, root) -> None:
    image = marked(*SHAPES[task.name])
    counts = sizes(task)
    if form == "folders":
        for split, n in counts.items():
            folder = root / task.name / split / "1"
            folder.mkdir(parents=True)
            for i in range(n):
                (folder / f"{i:06d}.png").write_bytes(image)
    elif form == "datasets":
        datasets = pytest.importorskip("datasets")
        parts = {split: datasets.Dataset.from_dict({"image": [{"bytes": image, "path": None}] * n,
                                                    **{k: [v] * n for k, v in features(task).items()}}
                                                   ).cast_column("image", datasets.Image())
                 for split, n in counts.items()}
        datasets.DatasetDict(parts).save_to_disk(str(root / task.source))
    else:
        version = root / task.source / task.config / task.version.replace("*", "0")
        version.mkdir(parents=True)
        (version / "dataset_info.json").write_text(json.dumps({"name": task.source}))
        flat = {f"objects/{k}": np.ravel(v).tolist() for k, v in features(task).get("objects", {}).items()}
        record = write_example({"image": [image], **(flat or {"label": [1]})})
        for split, n in counts.items():
            write_records(version / f"{task.source}-{split}.tfrecord-00000-of-00001", [record] * n)


def bands(x: torch.Tensor) -> tuple[float, float]:
    """The shares of a normalised or uint8 (3, H, W) image that are red and blue."""
    x = x.float() / 255 * 2 - 1 if x.dtype == torch.uint8 else x
    red = (x[0] > 0.6) & (x[1] < -0.6) & (x[2] < -0.6)
    blue = (x[2] > 0.6) & (x[0] < -0.6) & (x[1] < -0.6)
    return red.float().mean().item(), blue.float().mean().item()


@pytest.mark.parametrize("task,form", CASES)
def test_training_and_evaluation_see_the_whole_image(task, form, tmp_path):
    task = TASKS[task]
    write(task, form, tmp_path)
    base = vtab.task_config("c.safetensors", task, tmp_path, vtab.Settings(), Inputs())
    assert base.data.crop == "whole" and not base.data.hflip
    model = ViTConfig(image_size=base.model.changes["image_size"])  # 384: the paper's VTAB resolution
    for decode in ("pil", "fast"):
        cfg = base.with_overrides({"data.decode": decode})
        train, evals = build.open_datasets(cfg, model, None, Inputs())
        assert len(train) == 1000, (task.name, form)
        for i in (0, len(train) - 1):
            x, _ = train[i]
            assert x.shape == (3, 384, 384)
            red, blue = bands(x)
            # a tenth of the width each, as the whole image squashed to the square keeps it
            assert red == pytest.approx(0.1, abs=0.006) and blue == pytest.approx(0.1, abs=0.006), \
                (task.name, form, decode, red, blue)
        y, _ = evals["test"][0]
        assert bands(y) == pytest.approx(bands(x), abs=0.006), (task.name, form)


def test_pil_training_pixels_are_the_evaluation_pixels(tmp_path):
    """With decode=pil the training transform of VTAB is the evaluation transform, pixel for
    pixel (the same PIL resize of the whole image); the fast path's and the device path's
    (decode=cuda, its operations run on the CPU here) differ by rounding only."""
    from vitlab.data.decode import decode_planned
    from vitlab.pixels import normalise

    cfg = vtab.task_config("c.safetensors", TASKS["kitti_distance"], tmp_path, vtab.Settings(), Inputs())
    model = ViTConfig(image_size=(384, 384))
    image = Image.open(io.BytesIO(marked(375, 1242)))
    train, evaluate = build.data_transforms(cfg.with_overrides({"data.decode": "pil"}), model)
    pil = train(image)
    assert torch.equal(normalise(pil[None], model.mean, model.std)[0], evaluate(image))
    fast = build.data_transforms(cfg, model)[0](image)
    planned = build.data_transforms(cfg.with_overrides({"data.decode": "cuda"}), model)[0](image)
    device = decode_planned([planned], (384, 384), "cpu")[0]
    for other in (fast, device):
        assert (other.int() - pil.int()).abs().max().item() <= 2 and bands(other) == bands(pil)


def test_an_inception_crop_of_scale_one_still_cuts_a_wide_image():
    """Why VTAB states the whole image (data.crop=whole) instead of an inception crop of scale
    and ratio [1, 1]: no box of the whole area has ratio 1 on a non-square image, and the crop
    falls back to the central square (torchvision's rule), losing both edges."""
    from vitlab.data.transforms import train_transform

    image = Image.open(io.BytesIO(marked(375, 1242)))
    cut = train_transform(64, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), hflip=False, uint8=True)(image)
    whole = train_transform(64, crop="whole", hflip=False, uint8=True)(image)
    assert bands(cut) == (0.0, 0.0) and min(bands(whole)) > 0.08
    assert "crop: none, the whole image" in repr(train_transform(64, crop="whole"))
    with pytest.raises(ValueError, match="'middle': use one of inception, whole"):
        train_transform(64, crop="middle")


def test_a_patch_14_archive_runs_vtab_at_384(tmp_path, capsys):
    """ViT-H/14's case with a tiny /14 model in the official .npz layout: `vitlab vtab` at its
    default 384 takes a 27x27 grid (378 px) and ignores the last 6 pixel rows and columns, as
    the official VALID patch convolution does; the plan line and result.json say so."""
    from vitlab import checkpoints
    from vitlab.cli import main
    from vitlab.models import build

    config = ViTConfig(name="ViT-tiny/14", image_size=(224, 224), patch_size=14, hidden_size=32, depth=1, num_heads=2,
                       mlp_dim=64, num_classes=5)
    archive = tmp_path / "ViT-tiny_14.npz"
    checkpoints.save(build(config), archive, format="npz")
    write(TASKS["dtd"], "folders", tmp_path / "data")
    out = tmp_path / "suite"
    assert main(["vtab", str(archive), "--root", str(tmp_path / "data"), "--tasks", "dtd", "--steps", "2",
                 "--batch-size", "4", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "at 384x384 px; a 27x27 grid of 14-px patches at 384x384: the last 6 pixel rows and 6 columns are read by " \
           "no patch and ignored" in printed
    result = json.loads((out / "dtd" / "result.json").read_text())
    assert (result["image_size"], result["grid"], result["ignored_pixels"]) == ([384, 384], [27, 27], [6, 6])
    assert "the last 6 pixel rows and 6 columns ignored" in printed  # the task's line
    model = checkpoints.load(archive, image_size=384)  # loading: the position embedding resized to the floor grid
    assert model.pos_embed.grid == (27, 27) and model.pos_embed.pos_embedding.shape[1] == 27 * 27 + 1
