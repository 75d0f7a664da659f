"""The serving engine: bounded decoding of untrusted uploads, and the model's answers for them."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import png_claiming, small_classifier, zero_png
from vitlab.analysis import attention_rollout
from vitlab.analysis.overlay import COLOR_STOPS, color_table, overlay, overlay_png_base64
from vitlab.data.transforms import eval_transform
from vitlab.serve.engine import DISPLAY_SIDE, Engine, UploadError, decode


def encoded(array: np.ndarray, fmt: str = "PNG", mode=None) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array, mode).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def model():
    return small_classifier()


@pytest.fixture(scope="module")
def engine(model):
    return Engine(model, "fp32")


def refusal(data: bytes, max_pixels: int = 50_000_000) -> UploadError:
    with pytest.raises(UploadError) as e:
        decode(data, max_pixels)
    return e.value


def test_bad_uploads_are_refused_with_a_4xx_status_that_says_why():
    rng = np.random.default_rng(0)
    good = encoded(rng.integers(0, 255, (40, 30, 3), dtype=np.uint8))
    assert refusal(b"").status == 400
    assert refusal(b"just some text, not a picture").status == 415
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"  # PIL would run Ghostscript
    assert refusal(eps).status == 415
    broken = refusal(good[: len(good) // 2])
    assert broken.status == 422 and "damaged or truncated" in str(broken)
    for claim in (png_claiming(9_000, 9_000), png_claiming(100_000, 100_000)):  # the claim alone is refused
        huge = refusal(claim)
        assert huge.status == 422 and "decodes at most 50,000,000 pixels" in str(huge)
    assert "9000x9000" in str(refusal(png_claiming(9_000, 9_000)))


def test_a_decompression_bomb_is_refused_from_its_header():
    bomb = zero_png(10_000, 8_000)  # 80 MP of black in under 10 KB
    assert len(bomb) < 20_000
    e = refusal(bomb)
    assert e.status == 422 and "10000x8000" in str(e) and "50,000,000" in str(e)
    assert refusal(zero_png(20_000, 20_000)).status == 422  # past PIL's own limit too
    assert decode(zero_png(300, 200), 60_000).size == (300, 200)  # under the limit it decodes
    assert refusal(zero_png(300, 200), 59_999).status == 422


@pytest.mark.parametrize(
    "array, mode, fmt",
    [
        (np.full((20, 24), 200, np.uint8), None, "PNG"),  # greyscale
        (np.full((9, 13, 4), 100, np.uint8), "RGBA", "PNG"),
        (np.full((20, 20), 40000, np.uint16), None, "PNG"),  # 16-bit
        (np.full((16, 16, 3), 30, np.uint8), None, "JPEG"),
        (np.full((16, 16, 3), 30, np.uint8), None, "WEBP"),
        (np.full((16, 16, 3), 30, np.uint8), None, "BMP"),
    ],
)
def test_every_mode_becomes_the_models_input(engine, array, mode, fmt):
    p = engine.prepare(encoded(array, fmt, mode), 50_000_000, display=True)
    assert p.tensor.shape == (3, 32, 32) and p.tensor.dtype == torch.float32
    assert (p.width, p.height) == (array.shape[1], array.shape[0])
    assert p.display.mode == "RGB" and max(p.display.size) == DISPLAY_SIDE


def test_classify_is_the_models_softmax_for_the_checkpoints_preprocessing(model, engine):
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 255, (28 + i, 36, 3), dtype=np.uint8) for i in range(3)]
    transform = eval_transform(32, model.config.mean, model.config.std, 3)
    x = torch.stack([transform(Image.fromarray(a)) for a in images])
    with torch.no_grad():
        expected = model(x).softmax(-1).numpy()
    got = engine.classify([engine.prepare(encoded(a), 10**6).tensor for a in images])
    np.testing.assert_allclose(np.stack(got), expected, atol=1e-6)
    assert len(set(int(p.argmax()) for p in got)) >= 1 and abs(got[0].sum() - 1) < 1e-5


def test_look_returns_the_rollout_and_each_heads_class_token_attention(model, engine):
    x = torch.randn(2, 3, 32, 32)
    looked = engine.look(list(x))
    with torch.no_grad():
        out = model(x, return_intermediates=True)
    expected = attention_rollout(out["attentions"], out["grid"], 1)
    for i, result in enumerate(looked):
        np.testing.assert_allclose(result.probs, out["logits"][i].softmax(-1).numpy(), atol=1e-6)
        np.testing.assert_allclose(result.rollout, expected[i], atol=1e-6)
        assert result.heads.shape == (2, 2, 4, 4)  # layers, heads, grid
        cls_rows = torch.stack([a[i, :, 0, 1:] for a in out["attentions"]]).numpy().reshape(2, 2, 4, 4)
        np.testing.assert_allclose(result.heads, cls_rows, atol=1e-6)
    assert looked[0].rollout.max() == pytest.approx(1.0)


def test_gap_models_map_the_mean_over_queries():
    model = small_classifier(classifier="gap")
    engine = Engine(model, "fp32")
    x = torch.randn(1, 3, 32, 32)
    (result,) = engine.look(list(x))
    with torch.no_grad():
        out = model(x, return_intermediates=True)
    np.testing.assert_allclose(result.heads[1, 0], out["attentions"][1][0, 0].mean(0).reshape(4, 4).numpy(), atol=1e-6)


@pytest.mark.parametrize("precision", ["bf16", "int8", "fp32-packed"])
def test_the_fast_copies_answer_like_fp32(model, precision):
    fast, exact = Engine(model, precision), Engine(model, "fp32")
    x = list(torch.randn(8, 3, 32, 32))
    fast_probs, exact_probs = np.stack(fast.classify(x)), np.stack(exact.classify(x))
    assert np.abs(fast_probs - exact_probs).max() < 0.05
    looked = fast.look(x[:2])  # the attention path runs in the copy's own dtype
    assert looked[0].heads.shape == (2, 2, 4, 4) and np.isfinite(looked[0].rollout).all()
    fast.warm_up(4)


def test_a_model_without_head_is_refused():
    with pytest.raises(ValueError, match="num_classes=0"):
        Engine(small_classifier(num_classes=0), "fp32")


def test_describe_names_the_classes_and_the_preprocessing(engine):
    d = engine.describe()
    assert d["model"] == "ViT-test/8" and d["classes"][3] == "cat" and d["parameters"] > 0
    assert d["preprocessing"]["resize"] == [32, 32] and d["preprocessing"]["mean"] == [0.5, 0.5, 0.5]
    assert d["attention"] == {"layers": 2, "heads": 2, "grid": [4, 4]}
    assert d["config"]["patch_size"] == 8


def test_the_overlay_colours_the_map_over_the_image():
    table = color_table()
    assert table.shape == (256, 3) and tuple(table[0]) == COLOR_STOPS[0][1] and tuple(table[-1]) == COLOR_STOPS[-1][1]
    assert np.all(np.diff(table.astype(int).sum(1)) >= 0)  # brighter with more attention
    image = Image.new("RGB", (64, 48), (128, 128, 128))
    grid = np.zeros((2, 2))
    grid[0, 0] = 1.0  # all attention top left
    out = np.asarray(overlay(image, grid)).astype(int)
    assert out.shape == (48, 64, 3)
    assert out[2, 2].sum() > out[45, 60].sum() + 200  # hot corner bright, cold corner dark
    png = Image.open(io.BytesIO(base64.b64decode(overlay_png_base64(image, grid))))
    assert png.format == "PNG" and png.size == (64, 48)


def test_answers_name_a_reshaped_model_briefly(engine):
    import vitlab

    custom = Engine(vitlab.create_model("ViT-Ti/4", hidden_size=32, depth=2, num_heads=2, mlp_dim=64), "fp32")
    assert custom.config.name.startswith("ViT-Ti/4 (custom: width 32")
    assert custom.short_name == "ViT-Ti/4 (custom)" and engine.short_name == "ViT-test/8"
