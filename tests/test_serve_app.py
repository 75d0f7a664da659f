"""The HTTP API, in process (FastAPI's TestClient): answers, attention, errors, limits, metrics, keys."""

from __future__ import annotations

import base64
import io
import re
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("fastapi")
pytest.importorskip("fastapi_offline")
from fastapi.testclient import TestClient  # noqa: E402

from conftest import cifar_test_images, png_claiming, small_classifier, zero_png  # noqa: E402
from vitlab.analysis import attention_rollout  # noqa: E402
from vitlab.config import ServeConfig  # noqa: E402
from vitlab.data import read_image  # noqa: E402
from vitlab.data.transforms import eval_transform  # noqa: E402
from vitlab.serve import Engine, create_app  # noqa: E402
from vitlab.serve.engine import DISPLAY_SIDE  # noqa: E402


def png(seed: int, size=(40, 30)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def wait_ready(client, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while client.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "the server never became ready"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def model():
    return small_classifier()


def serving(model, **settings):
    return TestClient(create_app(Engine(model, "fp32", checkpoint="small.safetensors"), ServeConfig(**settings)))


@pytest.fixture(scope="module")
def client(model):
    with serving(model, max_upload_mb=1, max_files=4) as c:
        wait_ready(c)
        yield c


def expected_probs(model, data: bytes) -> np.ndarray:
    x = eval_transform(32, model.config.mean, model.config.std, 3)(read_image(io.BytesIO(data)))
    with torch.no_grad():
        return model(x[None]).softmax(-1)[0].numpy()


def check_top_k(result: dict, probs: np.ndarray, k: int) -> None:
    order = np.argsort(-probs, kind="stable")[:k]
    assert [p["index"] for p in result["predictions"]] == order.tolist()
    assert [p["class"] for p in result["predictions"]] == [small_classifier().class_names[i] for i in order]
    np.testing.assert_allclose([p["probability"] for p in result["predictions"]], probs[order], atol=1e-6)


def test_multipart_files_and_a_raw_body_get_the_models_top_k(client, model):
    a, b = png(1), png(2, (17, 50))
    r = client.post(
        "/predict?top_k=3", files=[("file", ("a.png", a, "image/png")), ("file", ("b.png", b, "image/png"))]
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "ViT-test/8" and body["precision"] == "fp32" and body["time_ms"] > 0
    assert [x["file"] for x in body["results"]] == ["a.png", "b.png"]
    assert (body["results"][1]["width"], body["results"][1]["height"]) == (50, 17)
    for result, data in zip(body["results"], (a, b), strict=True):
        check_top_k(result, expected_probs(model, data), 3)
        assert "attention" not in result
    raw = client.post("/predict", content=b, headers={"content-type": "image/png"})
    assert raw.status_code == 200
    check_top_k(raw.json()["results"][0], expected_probs(model, b), 5)  # the default k
    everything = client.post("/predict?top_k=1000", content=a).json()["results"][0]["predictions"]
    assert len(everything) == 10  # at most the model's classes


def test_real_cifar_images(client, model, cifar_dir):
    images = cifar_test_images(cifar_dir, 4)
    r = client.post("/predict?top_k=2", files=[("file", (n, d, "image/jpeg")) for n, d, _ in images])
    assert r.status_code == 200
    for result, (name, data, _) in zip(r.json()["results"], images, strict=True):
        assert result["file"] == name and result["width"] == 32
        check_top_k(result, expected_probs(model, data), 2)


def test_attention_returns_the_rollout_grid_and_an_overlay(client, model):
    data = png(3, (60, 90))
    r = client.post("/predict?attention=true&top_k=2", files={"file": ("wide.png", data, "image/png")})
    assert r.status_code == 200
    result = r.json()["results"][0]
    check_top_k(result, expected_probs(model, data), 2)
    x = eval_transform(32, model.config.mean, model.config.std, 3)(read_image(io.BytesIO(data)))[None]
    with torch.no_grad():
        out = model(x, return_intermediates=True)
    expected = attention_rollout(out["attentions"], out["grid"], 1)[0]
    np.testing.assert_allclose(np.array(result["attention"]["grid"]), expected, atol=1e-4)
    overlay = Image.open(io.BytesIO(base64.b64decode(result["attention"]["overlay_png"])))
    assert overlay.format == "PNG" and overlay.size == (DISPLAY_SIDE, DISPLAY_SIDE * 60 // 90)
    assert "heads" not in result["attention"]
    heads = client.post("/predict?attention=true&heads=true", content=data).json()["results"][0]["attention"]["heads"]
    assert np.array(heads).shape == (2, 2, 4, 4)  # layers, heads, grid rows, grid columns


@pytest.mark.parametrize(
    "make, status, words",
    [
        (lambda: {"content": b""}, 400, "empty"),
        (lambda: {"content": b"GIF89a, and then not a GIF"}, 415, "not an image"),
        (lambda: {"content": b"hello, I am a text file"}, 415, "not an image"),
        (lambda: {"content": png_claiming(30_000, 30_000)}, 422, "decodes at most"),
        (lambda: {"content": zero_png(10_000, 8_000)}, 422, "10000x8000"),  # a decompression bomb
        (lambda: {"content": png(1)[:300]}, 422, "damaged or truncated"),
        (lambda: {"files": {"image": ("a.png", png(1), "image/png")}}, 400, "no `file` field"),
        (lambda: {"data": {"file": "not a file"}, "files": {"other": ("x", b"x")}}, 400, "holds text"),
        (lambda: {"files": [("file", (f"{i}.png", png(i), "image/png")) for i in range(5)]}, 400, "Too many files"),
        (
            lambda: {
                "files": [("file", ("ok.png", png(1), "image/png")), ("file", ("bad.txt", b"nope", "text/plain"))]
            },
            415,
            "bad.txt",
        ),
        (lambda: {"content": b"x" * (2**20 + 1)}, 413, "1 MiB"),
        (lambda: {"content": iter([b"x" * 2**19] * 3)}, 413, "1 MiB"),  # chunked: no Content-Length
    ],
)
def test_bad_uploads_get_a_json_4xx_and_the_server_carries_on(client, make, status, words):
    r = client.post("/predict", **make())
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["status"] == status and words in r.json()["error"]
    assert client.post("/predict", content=png(4)).status_code == 200


@pytest.mark.parametrize(
    "query, words", [("top_k=0", "top_k"), ("top_k=many", "top_k"), ("attention=maybe", "attention")]
)
def test_bad_parameters_are_a_json_422(client, query, words):
    r = client.post(f"/predict?{query}", content=png(1))
    assert r.status_code == 422 and words in r.json()["error"]


def test_health_is_503_until_the_warm_up_is_done(model):
    release = threading.Event()
    engine = Engine(model, "fp32")
    warm_up = engine.warm_up
    engine.warm_up = lambda n: (release.wait(30), warm_up(n))
    with TestClient(create_app(engine, ServeConfig())) as c:
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "warming up"
        assert c.post("/predict", content=png(1)).status_code == 503
        release.set()
        wait_ready(c)
        assert c.get("/health").json() == {"status": "ready", "model": "ViT-test/8", "precision": "fp32"}
        assert c.post("/predict", content=png(1)).status_code == 200


def test_a_failed_warm_up_keeps_health_at_503_and_says_why(model):
    engine = Engine(model, "fp32")
    engine.warm_up = lambda n: 1 / 0
    with TestClient(create_app(engine, ServeConfig())) as c:
        deadline = time.monotonic() + 30
        while "failed" not in c.get("/health").json()["status"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = c.get("/health")
        assert r.status_code == 503 and "ZeroDivisionError" in r.json()["status"]


def test_info_describes_model_classes_preprocessing_and_limits(client):
    info = client.get("/info").json()
    assert info["model"] == "ViT-test/8" and info["checkpoint"] == "small.safetensors"
    assert info["classes"][:3] == ["airplane", "automobile", "bird"]
    assert info["config"]["image_size"] == [32, 32] and info["preprocessing"]["std"] == [0.5, 0.5, 0.5]
    assert info["server"]["max_upload_mb"] == 1 and info["server"]["api_key_required"] is False
    assert info["colormap"][0][0] == 0.0 and info["colormap"][-1][0] == 1.0


def metric(text: str, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}{re.escape('{' + want + '}') if want else ''} (\S+)$"
    found = re.findall(pattern, text, re.M)
    return float(found[0]) if found else 0.0


def test_metrics_count_requests_errors_latency_and_batches(model):
    with serving(model) as c:
        wait_ready(c)
        for i in range(3):
            assert (
                c.post(
                    "/predict", files=[("file", (f"{j}.png", png(j), "image/png")) for j in range(i + 1)]
                ).status_code
                == 200
            )
        assert c.post("/predict", content=b"").status_code == 400
        text = c.get("/metrics").text
    assert metric(text, "vitlab_requests_total", endpoint="/predict", status="200") == 3
    assert metric(text, "vitlab_request_errors_total", endpoint="/predict", status="400") == 1
    assert metric(text, "vitlab_request_latency_seconds_count", endpoint="/predict") == 4
    assert metric(text, "vitlab_batch_size_sum", kind="classify") == 6  # 1 + 2 + 3 images
    assert metric(text, "vitlab_images_total") == 6
    assert metric(text, "vitlab_model_info", model="ViT-test/8", precision="fp32") == 1
    assert metric(text, "process_resident_memory_bytes") > 10e6


def test_an_api_key_guards_predict_only(model):
    with serving(model, api_key="s3cret") as c:
        wait_ready(c)
        assert c.post("/predict", content=png(1)).status_code == 401
        wrong = c.post("/predict", content=png(1), headers={"X-API-Key": "guess"})
        assert wrong.status_code == 401 and wrong.json()["error"] == "the API key is wrong"
        assert c.post("/predict", content=png(1), headers={"X-API-Key": "s3cret"}).status_code == 200
        assert c.post("/predict", content=png(1), headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/info").json()["server"]["api_key_required"]
        assert "X-API-Key" in c.get("/openapi.json").text  # /docs offers to send it


def test_docs_and_page_are_served_without_anything_from_elsewhere(client):
    spec = client.get("/openapi.json").json()
    assert "securitySchemes" not in spec.get("components", {})  # no key asked for where none is set
    body = spec["paths"]["/predict"]["post"]["requestBody"]["content"]
    assert {"multipart/form-data", "application/octet-stream"} <= set(body)
    assert {"/health", "/info", "/metrics"} <= set(spec["paths"])
    docs = client.get("/docs")
    assert docs.status_code == 200 and "swagger-ui" in docs.text
    for url in re.findall(r'(?:src|href)="([^"]+)"', docs.text):
        assert url.startswith("/"), url  # bundled, not from a CDN
        assert client.get(url).status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
    for name in ("app.js", "style.css"):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and "http://" not in r.text and "https://" not in r.text
    assert client.get("/static/../app.py").status_code == 404
    assert client.get("/static/engine.py").status_code == 404


def test_a_bit_resnet_is_served_without_attention():
    """A BiT ResNet classifies like a ViT; it has no attention, so /info says so, the page
    asks for classes only, and ?attention=true is a 400 that says why."""
    from conftest import tiny_bit

    bit = tiny_bit(num_classes=3).eval()
    bit.class_names = ["cat", "dog", "fox"]
    with serving(bit) as c:
        wait_ready(c)
        info = c.get("/info").json()
        assert info["attention"] is None and info["classes"] == ["cat", "dog", "fox"]
        data = png(3, size=(32, 32))
        answer = c.post("/predict?top_k=2", files={"file": ("a.png", data, "image/png")})
        assert answer.status_code == 200
        top = answer.json()["results"][0]["predictions"]
        x = eval_transform(bit.config.image_size, bit.config.mean, bit.config.std, 3)(read_image(io.BytesIO(data)))
        with torch.no_grad():
            want = bit(x[None]).softmax(-1)[0].numpy()
        order = np.argsort(-want, kind="stable")[:2]
        assert [p["class"] for p in top] == [bit.class_names[i] for i in order]
        np.testing.assert_allclose([p["probability"] for p in top], want[order], atol=1e-6)
        refused = c.post("/predict?attention=true", files={"file": ("a.png", data, "image/png")})
        assert refused.status_code == 400 and "has no attention" in refused.json()["error"]
