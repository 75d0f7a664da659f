"""ImageNet class names: shipped as package data, equal to what their sources hold, attached
to ImageNet checkpoints, carried through every conversion, printed by `vitlab predict`."""

from __future__ import annotations

import importlib.util
import json

import torch
from PIL import Image

import vitlab
from hub_standin import TIMM, timm_repo_files
from vitlab.checkpoints import labels
from vitlab.cli import main

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def build_script():
    spec = importlib.util.spec_from_file_location("build_imagenet_labels", ROOT / "tools" / "build_imagenet_labels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_files_are_what_their_sources_hold():
    build = build_script()
    for count, rows in ((1000, build.imagenet_1k()), (21843, build.imagenet_21k())):
        assert labels.imagenet_names(count) == [n for _, n in rows]
        assert labels.imagenet_synsets(count) == [s for s, _ in rows]
        assert len(set(labels.imagenet_names(count))) == count  # unique, so label2id is a mapping
    names = labels.imagenet_names(1000)
    assert names[:3] == ["tench", "goldfish", "great white shark"] and names[999] == "toilet tissue"
    assert labels.imagenet_names(21843)[0] == "organism" and labels.imagenet_names(10) is None


def tiny(num_classes):
    torch.manual_seed(0)
    return vitlab.create_model("ViT-Ti/4", hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=num_classes)


def test_attached_to_imagenet_checkpoints_only(tmp_path, hub_cache):
    vitlab.save(tiny(1000), tmp_path / "in1k.npz", format="npz")
    vitlab.save(tiny(21843), tmp_path / "in21k.pth", format="timm", allow_numerics_change=True)
    assert vitlab.load(tmp_path / "in1k.npz").class_names[1] == "goldfish"
    assert vitlab.load(tmp_path / "in21k.pth").class_names[:1] == ["organism"]
    # A vitlab run of 1000 classes is not assumed to be ImageNet; nor is a 10-class npz named.
    vitlab.save(tiny(1000), tmp_path / "run.safetensors")
    vitlab.save(tiny(10), tmp_path / "ten.npz", format="npz")
    assert vitlab.load(tmp_path / "run.safetensors").class_names is None
    assert vitlab.load(tmp_path / "ten.npz").class_names is None
    files, _ = timm_repo_files()  # by name from the Hub: timm's repo has no label names
    hub_cache.add("timm/" + TIMM, files)
    assert vitlab.load("timm:" + TIMM).class_names[0] == "tench"


def test_class_names_survive_every_conversion(tmp_path):
    model = vitlab.create_model("ViT-Ti/4", hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=3,
                                layer_norm_eps=1e-6)
    model.class_names = ["île", "dog", "a \"quoted\" name"]
    path, current = None, model
    for fmt, name in (("npz", "a.npz"), ("timm", "b.safetensors"), ("hf", "c"), ("torchvision", "d.safetensors"),
                      ("vitlab", "e.safetensors"), ("npz", "f.npz")):
        path = tmp_path / name
        vitlab.save(current, path, format=fmt, **({} if fmt == "vitlab" else {"allow_numerics_change": True}))
        current = vitlab.load(path)
        assert current.class_names == model.class_names, fmt
    assert vitlab.load(path, num_classes=5).class_names is None  # a new head has no names yet
    # The .npz stays a plain archive of arrays for numpy (the names are its zip comment).
    import numpy as np

    with np.load(path) as f:
        assert all(f[k].dtype.kind == "f" for k in f.files)


def test_predict_prints_imagenet_names(tmp_path, capsys):
    model = tiny(1000)
    with torch.no_grad():
        model.head.bias[1] = 50.0  # goldfish, whatever the image
    vitlab.save(model, tmp_path / "in1k.npz", format="npz")
    Image.new("RGB", (40, 30), (200, 120, 30)).save(tmp_path / "photo.png")
    assert main(["predict", str(tmp_path / "in1k.npz"), str(tmp_path / "photo.png"), "--json", "--top-k", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["results"][0]["predictions"][0]["class"] == "goldfish"
