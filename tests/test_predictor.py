"""`vitlab.Predictor`, the one inference path of predict, serve and Python: batching does not
change the answers, top-k is the probabilities' order, attention maps and overlays come with
the rows, precisions are vitlab.deploy's copies, and bad inputs are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from conftest import CIFAR_CLASSES, small_classifier, tiny_bit
from vitlab.config import ConfigError


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    paths = []
    for i, size in enumerate([(40, 30), (32, 32), (17, 50), (64, 48), (33, 33)]):
        path = root / f"img{i}.png"
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def test_batching_does_not_change_the_answers_and_top_k_is_ordered(files):
    predictor = vitlab.Predictor(small_classifier())
    one = list(predictor.predict(files, top_k=10, batch_size=1))
    many = list(predictor.predict(files, top_k=3, batch_size=4))
    assert [r["image"] for r in one] == [str(f) for f in files] == [r["image"] for r in many]
    for a, b in zip(one, many, strict=True):
        np.testing.assert_allclose(a["probabilities"], b["probabilities"], atol=1e-6)
        probs = [p["probability"] for p in a["predictions"]]
        assert probs == sorted(probs, reverse=True) and sum(probs) == pytest.approx(1.0, abs=1e-5)
        assert [p["class"] for p in b["predictions"]] == [p["class"] for p in a["predictions"][:3]]
        assert {p["class"] for p in a["predictions"]} == set(CIFAR_CLASSES)
    direct = predictor.classify([predictor.preprocess(files[0])])[0]  # the same as the transform + model by hand
    model = small_classifier()
    with torch.no_grad():
        by_hand = model(vitlab.transform(model)(Image.open(files[0]))[None]).softmax(-1)[0].numpy()
    np.testing.assert_allclose(direct, by_hand, atol=1e-6)


def test_attention_and_overlays(files, tmp_path):
    predictor = vitlab.Predictor(small_classifier())
    rows = list(predictor.predict(files[:2], overlays=tmp_path / "maps"))
    for i, row in enumerate(rows):
        assert row["rollout"].shape == (4, 4) and row["rollout"].max() == pytest.approx(1.0)
        png = Image.open(row["attention"])
        assert png.format == "PNG" and max(png.width, png.height - 16) == 384 and row["attention"].endswith(f"{i:04d}_img{i}_rollout.png")
    looked = predictor.look([predictor.preprocess(files[0])])[0]
    assert looked.heads.shape == (2, 2, 4, 4)  # layers, heads, grid


def test_precisions_are_the_serving_copies(files):
    model = small_classifier()
    exact = vitlab.Predictor(model)
    x = [exact.preprocess(f) for f in files]
    want = np.stack(exact.classify(x))
    for precision in ("fp32-packed", "bf16"):
        got = np.stack(vitlab.Predictor(model, precision).classify(x))
        assert np.abs(got - want).max() < 0.02, precision
        assert (got.argmax(1) == want.argmax(1)).mean() >= 0.8


def test_refusals_name_the_problem(files, tmp_path):
    with pytest.raises(ConfigError, match="unknown precision 'fp8'; known: fp32"):
        vitlab.Predictor(small_classifier(), "fp8")
    with pytest.raises(ConfigError, match="no classification head"):
        vitlab.Predictor(small_classifier(num_classes=0))
    with pytest.raises(ConfigError, match="has no attention"):
        vitlab.Predictor(tiny_bit()).look([torch.zeros(3, 32, 32)])
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    seen = []
    rows = list(vitlab.Predictor(small_classifier()).predict([files[0], bad], on_error=lambda f, e: seen.append(f)))
    assert [r["image"] for r in rows] == [str(files[0])] and seen == [bad]


def test_load_reads_any_checkpoint(tmp_path, files):
    vitlab.save(small_classifier(), tmp_path / "m.safetensors")
    predictor = vitlab.Predictor.load(tmp_path / "m.safetensors")
    assert predictor.class_names == CIFAR_CLASSES and "EvalTransform" in repr(predictor.transform)
    assert next(predictor.predict(files[:1]))["predictions"][0]["class"] in CIFAR_CLASSES
