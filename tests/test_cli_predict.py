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
    for ra, rb in zip(a["results"], b["results"], strict=True):
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


def test_it_streams_batch_by_batch(ckpts, images, monkeypatch, capsys):
    """Each batch's lines are out before the next batch is decoded."""
    import sys

    from vitlab import predictor

    _, root = ckpts
    events = []
    real = predictor.read_image
    monkeypatch.setattr(predictor, "read_image", lambda path: events.append("decode") or real(path))

    class Out:
        def write(self, text):
            if text.strip():
                events.append("print")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Out())
    files = [images / "rgb.png", images / "grey.jpg", images / "palette.gif", images / "sub" / "rgba.png"]
    assert main(["predict", str(root / "model.safetensors"), *map(str, files), "--batch-size", "2"]) == 0
    assert events == ["decode", "decode", "print", "print", "decode", "decode", "print", "print"]


def test_csv_has_one_row_per_image_in_order(ckpts, images, tmp_path, capsys):
    import csv

    _, root = ckpts
    rc = main(["predict", str(root / "model.safetensors"), str(images), "--top-k", "2", "--csv", str(tmp_path / "p.csv"),
               "--batch-size", "2"])
    assert rc == 1
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    expected = sorted(str(f) for f in images.rglob("*") if f.is_file())
    assert [r["image"] for r in rows] == expected
    bad = [r for r in rows if r["error"]]
    assert [r["image"] for r in bad] == [str(images / "notes.png")] and bad[0]["class_1"] == ""
    good = [r for r in rows if not r["error"]]
    assert all(r["class_1"] in NAMES and 0 < float(r["probability_2"]) <= float(r["probability_1"]) for r in good)
    assert "wrote" in capsys.readouterr().err


def test_device_is_checked(ckpts, images, capsys):
    _, root = ckpts
    assert main(["predict", str(root / "model.safetensors"), str(images / "rgb.png"), "--device", "cpu"]) == 0
    capsys.readouterr()
    if not torch.cuda.is_available():
        assert main(["predict", str(root / "model.safetensors"), str(images / "rgb.png"), "--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert "no CUDA GPU" in err and len(err.strip().splitlines()) == 1
    assert main(["predict", str(root / "model.safetensors"), str(images / "rgb.png"), "--device", "tpu9"]) == 2
    assert "not a device" in capsys.readouterr().err


def test_overlays_name_the_predicted_class(ckpts, images, tmp_path, monkeypatch, capsys):
    """predict's overlay is serve's (one renderer, one colour map), captioned with the top class."""
    from vitlab import predictor
    from vitlab.analysis.overlay import color_table

    _, root = ckpts
    captions = []
    real = predictor.captioned
    monkeypatch.setattr(predictor, "captioned", lambda image, text: captions.append(text) or real(image, text))
    rc, res, _ = run_json(capsys, root / "model.safetensors", images / "rgb.png", "--attention", tmp_path)
    top = res["results"][0]["predictions"][0]
    assert rc == 0 and captions == [f"{top['class']} ({100 * top['probability']:.1f}%)"]
    png = Image.open(res["results"][0]["attention"])
    assert png.size == (288, 384 + 16)  # the 30x40 image at serve's display size, and the caption strip
    colours = {tuple(c) for c in color_table()}
    assert tuple(np.asarray(png)[-1, -1]) == (255, 255, 255) and colours  # the strip is white

def test_a_bit_resnet_predicts_and_refuses_attention_by_name(tmp_path, capsys):
    from conftest import tiny_bit

    vitlab.save(tiny_bit().eval(), tmp_path / "bit.safetensors")
    image = tmp_path / "x.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(image)
    assert main(["predict", str(tmp_path / "bit.safetensors"), str(image)]) == 0
    assert "x.png" in capsys.readouterr().out
    assert main(["predict", str(tmp_path / "bit.safetensors"), str(image), "--attention", str(tmp_path / "maps")]) == 2
    err = capsys.readouterr().err
    assert "has no attention to draw" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "maps").exists()
