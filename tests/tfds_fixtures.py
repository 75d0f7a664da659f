"""Tiny tfds data_dirs written by tensorflow-datasets' own builders, for the VTAB readers' tests.

Run as a script (`python tests/tfds_fixtures.py OUT`), in a process of its own so that no test
worker imports TensorFlow: tfds encodes images with TensorFlow and cannot write without it.
Each builder is tfds 4.9's own (`tfds.builder(NAME)`), run with a stand-in download manager
that hands it small raw files in the formats the real downloads have (dSprites' HDF5,
SmallNORB's binary matrices, Kaggle's retinopathy JPEGs and CSVs, the pets' tar layout); tfds
then generates, shuffles, encodes and shards the examples as for the real data. Written:

    OUT/dsprites/2.0.0                          1,000 train examples
    OUT/smallnorb/2.0.0                         800 train, 200 test
    OUT/diabetic_retinopathy_detection/{original,btgraham-300}/3.0.0
    OUT/oxford_iiit_pet/{3.2.0,4.0.0}           (3.2.0: tfds 4.9 ships only 4.0.0; the fixture
                                                 subclasses it with 3.2.0's features, which had
                                                 no head_bbox)
    OUT/expected.json                           what tfds itself reads back: per folder and
                                                split, the labels in stored order, the image
                                                shapes and the pixel range

Reading back goes through `builder.as_dataset(split, shuffle_files=False)`, the order VTAB's
slices refer to.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from PIL import Image

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def _build(builder, dl) -> None:
    """Prepare `builder` with `dl` as its download manager (nothing is downloaded)."""
    import tensorflow_datasets as tfds

    original = builder._split_generators
    builder._split_generators = lambda _manager: original(dl)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        download_mode=tfds.GenerateMode.REUSE_DATASET_IF_EXISTS))


def _binary_matrix(path: Path, array: np.ndarray) -> None:
    """SmallNORB's format: magic (uint8 or int32), ndim, max(3, ndim) dims, the data."""
    magic = 507333717 if array.dtype == np.uint8 else 507333716
    dims = list(array.shape) + [1] * max(0, 3 - array.ndim)
    head = np.array([magic, array.ndim, *dims], dtype="<i4").tobytes()
    path.write_bytes(head + array.astype(array.dtype if array.dtype == np.uint8 else "<i4").tobytes())


def dsprites(raw: Path, data: Path, n: int = 1000) -> None:
    """Sprites whose x position is where a white bar is drawn, so image and label can be checked
    against each other; pixels 0/1 as in the real HDF5."""
    import h5py
    import tensorflow_datasets as tfds

    images = np.zeros((n, 64, 64), np.uint8)
    classes = np.zeros((n, 6), np.int64)
    for i in range(n):
        x = i % 32
        images[i, 8:56, 2 * x : 2 * x + 2] = 1
        classes[i] = [0, i % 3, i % 6, (7 * i) % 40, x, (3 * i) % 32]
    path = raw / "dsprites.hdf5"
    with h5py.File(path, "w") as f:
        f["imgs"] = images
        f.create_group("latents")
        f["latents"]["classes"] = classes
        f["latents"]["values"] = classes.astype(np.float64) / 10
    _build(tfds.builder("dsprites", data_dir=str(data)), SimpleNamespace(download=lambda _url: str(path)))


def smallnorb(raw: Path, data: Path) -> None:
    import tensorflow_datasets as tfds

    rng = np.random.default_rng(0)
    files = {}
    for split, n in (("training", 800), ("testing", 200)):
        images = rng.integers(0, 256, (n, 2, 96, 96), dtype=np.uint8)
        info = np.stack([np.arange(n) % 10, np.arange(n) % 9, 2 * (np.arange(n) % 18), np.arange(n) % 6], 1)
        for kind, array in (("dat", images), ("cat", (np.arange(n) % 5).astype(np.int32)), ("info", info)):
            files[f"{split}_{kind}"] = raw / f"smallnorb-{split}-{kind}.mat"
            _binary_matrix(files[f"{split}_{kind}"], np.asarray(array))
    dl = SimpleNamespace(download_and_extract=lambda urls: {k: str(files[k]) for k in urls})
    _build(tfds.builder("smallnorb", data_dir=str(data)), dl)


def retinopathy(raw: Path, data: Path) -> None:
    """Kaggle's layout (manual_dir/{train,test,sample}/*.jpeg, trainLabels.csv) and the test
    labels' CSV; eyes drawn as bright discs so that btgraham's radius estimate works."""
    import tensorflow_datasets as tfds

    manual = raw / "retinopathy"
    rows = {"train": [], "test": [], "sample": []}
    for split, n in (("train", 6), ("test", 8), ("sample", 2)):
        (manual / split).mkdir(parents=True)
        for i in range(n):
            name = f"{10 + i}_{'left' if i % 2 else 'right'}"
            image = np.zeros((120, 160, 3), np.uint8)
            yy, xx = np.mgrid[:120, :160]
            image[(yy - 60) ** 2 + (xx - 80) ** 2 < 50**2] = (180, 90 + 10 * i, 40)
            Image.fromarray(image).save(manual / split / f"{name}.jpeg", quality=95)
            rows[split].append((name, i % 5, "Public" if i < 3 else "Private"))
    with open(manual / "trainLabels.csv", "w", newline="") as f:
        csv.writer(f).writerows([("image", "level"), *((n, y) for n, y, _ in rows["train"])])
    solution = raw / "retinopathy_solution.csv"
    with open(solution, "w", newline="") as f:
        csv.writer(f).writerows([("image", "level", "Usage"), *rows["test"]])
    for config in ("original", "btgraham-300"):
        dl = SimpleNamespace(manual_dir=str(manual), download=lambda _url: str(solution))
        _build(tfds.builder(f"diabetic_retinopathy_detection/{config}", data_dir=str(data)), dl)


def _pets_raw(raw: Path) -> dict[str, str]:
    images, notes = raw / "pets-images" / "images", raw / "pets-annotations" / "annotations"
    for d in (images, notes / "trimaps", notes / "xmls"):
        d.mkdir(parents=True)
    lines = {"trainval": [], "test": []}
    for split, n in (("trainval", 6), ("test", 4)):
        for i in range(n):
            label = (5 * i + (split == "test")) % 37 + 1
            name = f"breed{label}_{split}{i}"
            Image.fromarray(np.full((24, 32, 3), 8 * label, np.uint8)).save(images / f"{name}.jpg")
            Image.fromarray(np.full((24, 32), 1 + i % 3, np.uint8)).save(notes / "trimaps" / f"{name}.png")
            if split == "trainval":
                (notes / "xmls" / f"{name}.xml").write_text(
                    "<annotation><size><width>32</width><height>24</height></size><object><bndbox>"
                    "<xmin>2</xmin><ymin>3</ymin><xmax>20</xmax><ymax>18</ymax></bndbox></object></annotation>")
            lines[split].append(f"{name} {label} {1 + label % 2} 1")
        (notes / f"{split}.txt").write_text("\n".join(lines[split]) + "\n")
    return {"images": str(images.parent), "annotations": str(notes.parent)}


def pets(raw: Path, data: Path) -> None:
    """Two versions in one folder: 4.0.0 (tfds 4.9's builder) and 3.2.0, the version VTAB pins
    (`oxford_iiit_pet:3.*.*`), which had the same examples without the head boxes."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.datasets.oxford_iiit_pet import oxford_iiit_pet_dataset_builder as pet

    paths = _pets_raw(raw)
    dl = SimpleNamespace(download_and_extract=lambda urls: {k: paths[k] for k in urls})
    _build(tfds.builder("oxford_iiit_pet:4.0.0", data_dir=str(data)), dl)

    with tfds.core.registered.skip_registration():  # the name is 4.0.0's already
        class Pets3(pet.Builder):
            name = "oxford_iiit_pet"
            VERSION = tfds.core.Version("3.2.0")
            RELEASE_NOTES = {"3.2.0": "(as tfds 4.x's 3.2.0: no head_bbox)"}

            def _info(self):
                info = super()._info()
                features = {k: v for k, v in info.features.items() if k != "head_bbox"}
                return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(features),
                                                      supervised_keys=("image", "label"), homepage=info.homepage)

            def _generate_examples(self, **kw):
                for key, record in super()._generate_examples(**kw):
                    record.pop("head_bbox")
                    yield key, record

    _build(Pets3(data_dir=str(data)), dl)


def read_back(data: Path) -> dict[str, dict[str, dict]]:
    """{folder relative to data: {split: labels, shapes, pixel range}}, read by tfds itself."""
    import tensorflow_datasets as tfds

    label_keys = {"dsprites": "label_x_position", "smallnorb": "label_azimuth"}
    out: dict[str, dict[str, dict]] = {}
    for info in sorted(data.rglob("dataset_info.json")):
        folder = info.parent
        builder = tfds.builder_from_directory(str(folder))
        key = label_keys.get(builder.name, "label")
        out[str(folder.relative_to(data))] = splits = {}
        for split in builder.info.splits:
            labels, shapes, low, high = [], set(), 255, 0
            for example in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)):
                labels.append(int(example[key]))
                shapes.add(tuple(int(s) for s in example["image"].shape))
                low, high = min(low, int(example["image"].min())), max(high, int(example["image"].max()))
            splits[split] = {"labels": labels, "shapes": sorted(shapes), "min": low, "max": high}
    return out


def main(out: Path) -> None:
    raw, data = out / "raw", out / "data"
    raw.mkdir(parents=True)
    for build in (dsprites, smallnorb, retinopathy, pets):
        build(raw, data)
    (out / "expected.json").write_text(json.dumps(read_back(data)))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
