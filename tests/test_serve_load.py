"""Over real HTTP (uvicorn on 127.0.0.1): concurrent clients are batched together, the load
generator is bounded and local, and no request goes unanswered."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("uvicorn")
pytest.importorskip("fastapi_offline")

from conftest import live_server, small_classifier  # noqa: E402
from loadgen import run_load  # noqa: E402  (benchmarks/loadgen.py: on sys.path by conftest)
from vitlab.config import ServeConfig  # noqa: E402
from vitlab.serve import Engine, create_app  # noqa: E402


def png(seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def batch_sizes():
    sizes = []

    def check(body: bytes) -> bool:
        result = json.loads(body)["results"][0]
        sizes.append(result["batch_size"])
        return len(result["predictions"]) == 5

    return sizes, check


@pytest.fixture(scope="module")
def model():
    return small_classifier()


def test_concurrent_clients_share_forward_passes(model):
    app = create_app(Engine(model, "fp32"), ServeConfig(max_batch=8, max_wait_ms=50))
    sizes, check = batch_sizes()
    with live_server(app) as url:
        result = run_load(port_of(url), png(), concurrency=16, requests=96, check=check)
    assert result.answered == 96 and result.statuses == {200: 96} and not result.errors and result.bad_bodies == 0
    assert max(sizes) == 8  # full batches under load...
    assert np.mean(sizes) > 4  # ...most of the time
    assert result.throughput > 0 and 0 < result.percentile_ms(50) <= result.percentile_ms(99)


def test_max_batch_one_serves_each_request_alone(model):
    app = create_app(Engine(model, "fp32"), ServeConfig(max_batch=1))
    sizes, check = batch_sizes()
    with live_server(app) as url:
        result = run_load(port_of(url), png(), concurrency=8, requests=40, check=check)
    assert result.statuses == {200: 40} and set(sizes) == {1}


def test_a_duration_bounds_the_load_and_refusals_are_counted_not_lost(model):
    app = create_app(Engine(model, "fp32"), ServeConfig(max_upload_mb=0.001))
    with live_server(app) as url:
        big = run_load(port_of(url), b"x" * 5000, concurrency=4, requests=20)
        timed = run_load(port_of(url), png(), concurrency=4, duration=0.5)
    assert big.statuses == {413: 20} and not big.errors  # refused with a closed connection, then reconnected
    assert timed.answered > 0 and timed.elapsed < 10 and set(timed.statuses) == {413}


def test_the_load_generator_only_sends_to_this_machine():
    with pytest.raises(ValueError, match="only sends to this machine"):
        run_load(80, b"", host="192.0.2.1", requests=1)
    with pytest.raises(ValueError, match="bounded"):
        run_load(80, b"")
