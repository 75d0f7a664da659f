"""One inference path (issue 20's done-when test): for an imported timm checkpoint (crop 0.9,
bicubic, shorter side) and an imported Hugging Face checkpoint (its own ViTImageProcessor),
every way vitlab feeds images to a model gives the same probabilities for each of 50 real
CIFAR-10 test images (upsampled to 84x100, written as PNG files), within 1e-5:

- `vitlab eval --predictions` (the dataset path: open_dataset + the loader),
- `vitlab predict --json` (Predictor, files),
- `vitlab serve` (its FastAPI app over HTTP in-process, uploads decoded by the server),
- the features `vitlab fewshot` reads (dataset_features), through the checkpoint's head,
- `vitlab.load(...)` + `vitlab.transform(...)`;

and those equal what the checkpoint's own library gives: timm's resolve_data_config +
create_transform + forward, and transformers' pipeline("image-classification") with the
saved image processor. A different resize backend or crop would move them by far more than
1e-5 (the test checks that too), so the test can fail.
"""

from __future__ import annotations

import csv
import io
import json
import time

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from conftest import CIFAR_CLASSES, cifar_test_images, perturb
from vitlab.cli import main

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

SIZE = 64
TOL = 1e-5
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """50 real CIFAR-10 test images, 5 per class, upsampled to 100x84 (bicubic), as PNG files
    in an image folder (ROOT/test/CLASS/...; train/ holds the same files for fewshot)."""
    from conftest import SHARED_DATA

    shards = SHARED_DATA / "cifar10"
    if not any(shards.glob("test-*.tar*")):
        pytest.skip(f"needs the CIFAR-10 shards in {shards}")
    root = tmp_path_factory.mktemp("photos")
    taken = {c: 0 for c in range(10)}
    files = []
    for name, data, label in cifar_test_images(shards, 400):
        if taken[label] == 5:
            continue
        taken[label] += 1
        image = Image.open(io.BytesIO(data)).convert("RGB").resize((100, 84), Image.BICUBIC)
        for split in ("train", "test"):
            path = root / split / CIFAR_CLASSES[label] / f"{name.rsplit('.', 1)[0]}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            image.save(path)
        files.append(root / "test" / CIFAR_CLASSES[label] / f"{name.rsplit('.', 1)[0]}.png")
    assert len(files) == 50
    return root, sorted(files)


def timm_checkpoint(folder):
    """A small timm ViT with a pretrained_cfg (crop 0.9, bicubic, centre), saved as timm saves
    a Hub folder (config.json + model.safetensors)."""
    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=SIZE, embed_dim=64, depth=2,
                              num_heads=2, num_classes=10)
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (3, SIZE, SIZE), "crop_pct": 0.9,
                            "crop_mode": "center", "interpolation": "bicubic", "mean": MEAN, "std": STD,
                            "num_classes": 10, "label_names": list(CIFAR_CLASSES)}
    perturb(model, scale=0.2)
    timm.models.save_for_hf(model, folder, model_args={"img_size": SIZE, "embed_dim": 64, "depth": 2, "num_heads": 2},
                            safe_serialization=True)
    return model


def hf_checkpoint(folder):
    """A small ViTForImageClassification and its ViTImageProcessor, saved with save_pretrained."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(1)
    config = ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                       image_size=SIZE, patch_size=16, num_labels=10,
                       id2label=dict(enumerate(CIFAR_CLASSES)), label2id={c: i for i, c in enumerate(CIFAR_CLASSES)})
    model = perturb(ViTForImageClassification(config), scale=0.2)
    model.save_pretrained(folder)
    ViTImageProcessor(size={"height": SIZE, "width": SIZE}, resample=3, image_mean=list(MEAN),
                      image_std=list(STD)).save_pretrained(folder)
    return model


def theirs_timm(model, files) -> np.ndarray:
    from timm.data import create_transform, resolve_data_config

    transform = create_transform(**resolve_data_config(model=model))
    with torch.no_grad():
        return np.stack([model(transform(Image.open(f).convert("RGB"))[None]).softmax(-1)[0].numpy() for f in files])


def theirs_hf(folder, files) -> np.ndarray:
    from transformers import pipeline

    classify = pipeline("image-classification", model=str(folder), device="cpu")
    rows = []
    for f in files:
        scores = {r["label"]: r["score"] for r in classify(Image.open(f), top_k=10)}
        rows.append([scores[c] for c in CIFAR_CLASSES])
    return np.array(rows)


def by_name(rows: dict[str, list[float]], files) -> np.ndarray:
    return np.array([rows[str(f)] for f in files])


def vitlab_ways(path, root, files, tmp_path, capsys) -> dict[str, np.ndarray]:
    """The same 50 images' probabilities, each way vitlab gives them."""
    from fastapi.testclient import TestClient

    from vitlab.config.serve import ServeConfig
    from vitlab.eval.features import dataset_features
    from vitlab.serve import Engine, create_app

    ways = {}
    model = vitlab.load(path)
    transform = vitlab.transform(model)
    with torch.no_grad():
        ways["load+transform"] = np.stack([model(transform(Image.open(f))[None]).softmax(-1)[0].numpy() for f in files])
    spec = f"imagefolder:{root}"
    out = tmp_path / "eval.csv"
    assert main(["eval", str(path), "--data", spec, "--predictions", str(out), "--out", str(tmp_path / "e")]) == 0
    with open(out) as f:
        reader = csv.DictReader(f)
        ways["eval"] = by_name({r["image"]: [float(r[c]) for c in CIFAR_CLASSES] for r in reader}, files)
    capsys.readouterr()
    assert main(["predict", str(path), *map(str, files), "--top-k", "10", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    ways["predict"] = by_name({r["image"]: [p["probability"] for p in sorted(r["predictions"], key=lambda p: p["index"])]
                               for r in rows}, files)
    with TestClient(create_app(Engine(model), ServeConfig(max_files=50))) as client:
        deadline = time.monotonic() + 120
        while client.get("/health").status_code != 200:  # the warm-up runs on the model's thread
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.05)
        reply = client.post("/predict?top_k=10", files=[("file", (str(f), f.read_bytes(), "image/png")) for f in files])
        assert reply.status_code == 200, reply.text
        ways["serve"] = by_name({r["file"]: [p["probability"] for p in sorted(r["predictions"], key=lambda p: p["index"])]
                                 for r in reply.json()["results"]}, files)
    features, _, _ = dataset_features(model, spec, "test", use_cache=False)
    order = [str(f) for f in vitlab.data.open_dataset(spec, "test", transform).files]
    with torch.no_grad():
        probs = model.head(torch.from_numpy(features)).softmax(-1).numpy()
    ways["fewshot features"] = probs[[order.index(str(f)) for f in files]]
    return ways


def check(ways: dict[str, np.ndarray], reference: np.ndarray, source: str) -> None:
    assert reference.shape == (50, 10) and reference.std(0).max() > 0.01  # the images give different answers
    for way, probs in ways.items():
        gap = np.abs(probs - reference).max()
        print(f"{source}: {way} within {gap:.1e}")  # shown with pytest -s
        assert gap <= TOL, f"{way} differs from {source} by {gap:.2e}"


def test_a_timm_checkpoint_gives_timms_probabilities_every_way(photos, tmp_path, capsys):
    root, files = photos
    folder = tmp_path / "timm"
    theirs = timm_checkpoint(folder)
    cfg = vitlab.load(folder).config
    assert (cfg.crop_fraction, cfg.crop_mode, cfg.interpolation, cfg.resize_backend) == (0.9, "center", "bicubic", "pil")
    reference = theirs_timm(theirs.eval(), files)
    check(vitlab_ways(folder, root, files, tmp_path, capsys), reference, "timm")
    squashed = vitlab.load(folder, crop_fraction=1.0, crop_mode="squash")  # the paper's resize: other pixels
    with torch.no_grad():
        moved = np.stack([squashed(vitlab.transform(squashed)(Image.open(f))[None]).softmax(-1)[0].numpy() for f in files])
    assert np.abs(moved - reference).max() > 100 * TOL


def test_a_hugging_face_checkpoint_gives_the_pipelines_probabilities_every_way(photos, tmp_path, capsys):
    root, files = photos
    folder = tmp_path / "hf"
    hf_checkpoint(folder)
    model = vitlab.load(folder)
    assert model.config.resize_backend == "tensor" and model.config.interpolation == "bicubic"
    assert model.class_names == CIFAR_CLASSES
    reference = theirs_hf(folder, files)
    check(vitlab_ways(folder, root, files, tmp_path, capsys), reference, "transformers' pipeline")
    as_pil = vitlab.transform(model.config.replace(resize_backend="pil"))  # PIL's resize: a grey level off here and there
    with torch.no_grad():
        moved = np.stack([model(as_pil(Image.open(f))[None]).softmax(-1)[0].numpy() for f in files])
    assert np.abs(moved - reference).max() > 10 * TOL
