"""The page at `/` in a real browser: Debian's Chromium, headless, driven by playwright.

The test picks an image in the page's file input, waits for the answer and checks what the
page shows against the API's own answer for the same file: the top-k bars, the heat map over
the image (and that choosing a layer and head redraws it), the colour scale; then it drops
the same image on the drop zone, and picks a file that is not an image, which must show an
error. Every request the page makes outside the server is blocked
and counted, so a CDN reference would fail the test.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("uvicorn")
pytest.importorskip("fastapi_offline")
sync_api = pytest.importorskip("playwright.sync_api")

from conftest import live_server, small_classifier  # noqa: E402
from vitlab.analysis.overlay import COLOR_STOPS  # noqa: E402
from vitlab.config import ServeConfig  # noqa: E402
from vitlab.serve import Engine, create_app  # noqa: E402

CHROMIUM = os.environ.get("VITLAB_CHROMIUM", "/usr/bin/chromium")
# Quiet, offline, sandbox-free (tests run as root in CI): no first-run page, no updates, no sync.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = pytest.mark.skipif(
    not shutil.which(CHROMIUM), reason=f"needs Chromium at {CHROMIUM} (apt-get install chromium)"
)


def canvas_pixels(page, selector: str) -> np.ndarray:
    data = page.evaluate(
        """(sel) => { const c = document.querySelector(sel);
                      return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data); }""",
        selector,
    )
    return np.array(data, dtype=np.uint8)


def api_answer(url: str, path: Path) -> dict:
    request = urllib.request.Request(f"{url}/predict?top_k=5", data=path.read_bytes(), method="POST")
    return json.loads(urllib.request.urlopen(request, timeout=30).read())["results"][0]


def check_heat_map(page, view: str) -> None:
    """The map is drawn over the image, another layer and head draw another map, and the
    colour scale runs from the first colour stop to the last."""
    rollout = canvas_pixels(page, view)
    page.fill("#opacity", "0")
    page.dispatch_event("#opacity", "input")
    plain = canvas_pixels(page, view)
    page.fill("#opacity", "0.6")
    page.dispatch_event("#opacity", "input")
    assert np.abs(rollout.astype(int) - plain.astype(int)).mean() > 5
    page.select_option("#layer", "1")
    page.select_option("#head", "0")
    assert page.get_attribute(view, "data-map") == "1/0"
    assert not np.array_equal(canvas_pixels(page, view), rollout)
    scale = canvas_pixels(page, "#scale").reshape(14, 256, 4)
    assert tuple(scale[7, 0, :3]) == COLOR_STOPS[0][1] and tuple(scale[7, 255, :3]) == COLOR_STOPS[-1][1]


def drop(page, data: bytes, name: str) -> None:
    """Drag and drop: a file with these bytes, dropped on the page's drop zone."""
    page.evaluate(
        """([bytes, name]) => { const t = new DataTransfer();
                                t.items.add(new File([new Uint8Array(bytes)], name, {type: 'image/png'}));
                                document.querySelector('#drop').dispatchEvent(
                                    new DragEvent('drop', {dataTransfer: t, bubbles: true, cancelable: true})); }""",
        [list(data), name],
    )


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1100, "height": 800},
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def test_the_page_classifies_a_picked_image_and_draws_its_attention(browser_page, tmp_path):
    page = browser_page
    rng = np.random.default_rng(0)
    picture = tmp_path / "stripes.png"
    pixels = np.zeros((48, 64, 3), np.uint8)
    pixels[:, ::8] = 255
    pixels[10:30, 20:40] = rng.integers(0, 255, (20, 20, 3))
    Image.fromarray(pixels).save(picture)
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("these are notes, not a picture")

    app = create_app(Engine(small_classifier(), "fp32"), ServeConfig())
    with live_server(app) as url:
        outside, problems = [], []
        page.route(
            "**/*",
            lambda route: (
                route.continue_()
                if route.request.url.startswith(url)
                else (outside.append(route.request.url), route.abort())
            ),
        )
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(url + "/")
        page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        assert "ViT-test/8" in page.inner_text("#model")

        page.set_input_files("#picker", str(picture))
        card = page.wait_for_selector(".card[data-state=done]", timeout=30_000)
        expected = api_answer(url, picture)
        shown = [
            (li.query_selector(".class").inner_text(), li.query_selector(".probability").inner_text())
            for li in card.query_selector_all(".bars li")
        ]
        assert shown == [(p["class"], f"{100 * p['probability']:.1f}%") for p in expected["predictions"]]
        widths = page.eval_on_selector_all(".card .bars .fill", "els => els.map(e => parseFloat(e.style.width))")
        assert widths == sorted(widths, reverse=True) and widths[0] > 0
        assert "stripes.png" in card.inner_text()

        check_heat_map(page, ".card[data-state=done] canvas.view")
        drop(page, picture.read_bytes(), "dropped.png")
        page.wait_for_selector(".card:nth-child(2)[data-state=done]", timeout=30_000)
        dropped = page.query_selector_all(".card")[1]
        assert "dropped.png" in dropped.inner_text()
        assert dropped.query_selector(".bars .class").inner_text() == expected["predictions"][0]["class"]

        page.set_input_files("#picker", str(not_an_image))
        failed = page.wait_for_selector(".card[data-state=error]", timeout=30_000)
        assert "415" in failed.inner_text() and "not an image" in failed.inner_text()
        page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    assert not outside, f"the page asked for something from elsewhere: {outside}"
    assert not [p for p in problems if "415" not in p], problems  # the refused upload logs its 415


def test_the_page_sends_a_non_ascii_api_key_as_its_utf8(browser_page, tmp_path):
    """A key typed into the page reaches the server as the key's UTF-8 bytes, as curl sends
    it (tests/test_reliability_api.py): the right key is let in, a near miss is not."""
    page = browser_page
    page.unroute("**/*")  # the page test's route let only its own server's address through
    key = "clé-secrète-ключ-🔑"
    picture = tmp_path / "p.png"
    Image.new("RGB", (40, 30), (30, 60, 200)).save(picture)
    app = create_app(Engine(small_classifier(), "fp32"), ServeConfig(api_key=key))
    with live_server(app) as url:
        page.goto(url + "/")
        page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        page.fill("#apikey", key[:-1])
        page.set_input_files("#picker", str(picture))
        refused = page.wait_for_selector(".card[data-state=error]", timeout=30_000)
        assert "401" in refused.inner_text()
        page.fill("#apikey", key)
        again = tmp_path / "p2.png"  # another file: picking the same one again fires no change
        Image.new("RGB", (40, 30), (90, 60, 20)).save(again)
        page.set_input_files("#picker", str(again))
        for _ in range(300):  # the page's CSP forbids wait_for_function's eval: poll
            if len(page.query_selector_all(".card:not([data-state=pending])")) == 2:
                break
            page.wait_for_timeout(100)
        states = page.eval_on_selector_all(".card", "els => els.map(e => [e.dataset.state, e.innerText])")
        assert sorted(s for s, _ in states) == ["done", "error"], states
