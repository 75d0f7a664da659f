"""`vitlab predict`: files, folders, globs, any image mode, bad files, other checkpoint formats."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import main
from vitlab.config import ViTConfig
from vitlab.data import read_image
from vitlab.data.transforms import eval_transform

NAMES = ["zero", "one", "two", "three", "four"]


def make_model(**kw):
    torch.manual_seed(0)
    cfg = ViTConfig(
        name="tiny",
        image_size=16,
        patch_size=4,
        hidden_size=32,
        depth=2,
        num_heads=2,
        mlp_dim=64,
        num_classes=5,
        head_init="xavier",
        **kw,
    )
    model = vitlab.VisionTransformer(cfg).eval()
    model.class_names = list(NAMES)
    return model


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    model = make_model()
    vitlab.save(model, root / "model.safetensors")
    vitlab.save(model, root / "timm.safetensors", format="timm")
    return model, root


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    (root / "sub").mkdir()
    Image.fromarray(rng.integers(0, 255, (40, 30, 3), dtype=np.uint8)).save(root / "rgb.png")
    Image.fromarray(rng.integers(0, 255, (20, 20), dtype=np.uint8)).save(root / "grey.jpg")
    Image.fromarray(rng.integers(0, 255, (9, 13, 4), dtype=np.uint8), "RGBA").save(root / "sub" / "rgba.png")
    Image.fromarray(rng.integers(0, 65535, (20, 20), dtype=np.uint16)).save(root / "sub" / "deep16.png")
    Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).convert("P").save(root / "palette.gif")
    (root / "notes.png").write_text("this is not an image")
    return root


def run_json(capsys, *argv):
    rc = main(["predict", *map(str, argv), "--json"])
    out = capsys.readouterr()
    return rc, json.loads(out.out), out.err


@pytest.mark.slow
def test_every_mode_and_a_bad_file(ckpts, images, capsys):
    model, root = ckpts
    rc, res, err = run_json(capsys, root / "model.safetensors", images, "--top-k", "5")
    assert rc == 1  # one file failed
    assert [e["image"] for e in res["errors"]] == [str(images / "notes.png")]
    assert "notes.png: not an image" in err
    got = {r["image"]: r for r in res["results"]}
    assert len(got) == 5
    transform = eval_transform(16, model.config.mean, model.config.std, 3)
    for path, r in got.items():
        x = transform(read_image(path))[None]
        probs = model(x).softmax(-1)[0]
        top = r["predictions"]
        assert [p["class"] for p in top] == [NAMES[i] for i in probs.argsort(descending=True).tolist()]
        np.testing.assert_allclose(
            [p["probability"] for p in top], probs.sort(descending=True).values.tolist(), rtol=1e-5
        )
        assert sum(p["probability"] for p in top) == pytest.approx(1.0, abs=1e-5)


def test_table_globs_and_top_k(ckpts, images, capsys):
    _, root = ckpts
    rc = main(
        ["predict", str(root / "model.safetensors"), str(images / "*.png"), str(images / "grey.jpg"), "--top-k", "2"]
    )
    out = capsys.readouterr()
    assert rc == 1 and "rgb.png" in out.out and "grey.jpg" in out.out
    lines = [line for line in out.out.splitlines() if line.strip()]
    assert len(lines) == 2 and all(line.count("%") == 2 for line in lines)
    rc = main(["predict", str(root / "model.safetensors"), str(images / "rgb.png")])
    assert rc == 0


def test_other_format_gives_the_same_predictions(ckpts, images, capsys):
    _, root = ckpts
    _, a, _ = run_json(capsys, root / "model.safetensors", images / "rgb.png", images / "sub")
    _, b, _ = run_json(capsys, root / "timm.safetensors", images / "rgb.png", images / "sub")
    assert len(a["results"]) == 3
    for ra, rb in zip(a["results"], b["results"]):
        assert [p["index"] for p in ra["predictions"]] == [p["index"] for p in rb["predictions"]]
        np.testing.assert_allclose(
            [p["probability"] for p in ra["predictions"]], [p["probability"] for p in rb["predictions"]], rtol=1e-5
        )


def test_attention_overlays(ckpts, images, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _, root = ckpts
    rc, res, _ = run_json(
        capsys, root / "timm.safetensors", images / "rgb.png", images / "sub", "--attention", tmp_path
    )
    assert rc == 0
    written = sorted(tmp_path.glob("*.png"))
    assert len(written) == 3 and all(p.read_bytes()[:4] == b"\x89PNG" for p in written)
    assert {r["attention"] for r in res["results"]} == {str(p) for p in written}


def test_clear_errors(ckpts, images, tmp_path, capsys):
    _, root = ckpts
    assert main(["predict", str(root / "model.safetensors"), str(tmp_path / "missing.png")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["predict", str(root / "model.safetensors"), str(images / "*.tiff")]) == 2
    assert "matches no files" in capsys.readouterr().err
    headless = make_model().eval()
    headless.reset_classifier(0)
    vitlab.save(headless, tmp_path / "headless.safetensors")
    assert main(["predict", str(tmp_path / "headless.safetensors"), str(images / "rgb.png")]) == 2
    assert "no classification head" in capsys.readouterr().err
