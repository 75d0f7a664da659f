"""Pretrained names: one download into the cache, checksums, clear failures offline.

The "official storage" here is a folder served on 127.0.0.1 (or read through file://),
holding small checkpoints written by vitlab under the official file names.
"""

from __future__ import annotations

import functools
import http.server
import threading
import time

import pytest
import torch

import vitlab
from vitlab.checkpoints import pretrained
from vitlab.checkpoints.io import CheckpointError
from vitlab.files import sha256_file

NAME = "ViT-B/16:imagenet21k"


@pytest.fixture
def storage(tmp_path):
    """A mirror of the bucket with one small checkpoint at ViT-B/16:imagenet21k's path."""
    root = tmp_path / "bucket"
    entry = pretrained.PRETRAINED[NAME]
    torch.manual_seed(0)
    model = vitlab.create_model("ViT-Ti/16", depth=1, image_size=32, num_classes=3, representation_size=8)
    vitlab.save(model, root / entry.path, format="npz")
    return root, model


@pytest.fixture
def server(storage):
    root, _ = storage
    hits = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", hits
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("VITLAB_OFFLINE", raising=False)
    return tmp_path / "cache"


def test_download_once_then_cache(storage, server, cache, monkeypatch, capsys):
    url, hits = server
    monkeypatch.setenv("VITLAB_BASE_URL", url)
    model = vitlab.load(NAME)
    _, original = storage
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), original.state_dict().values(), strict=True))
    path = cache / pretrained.PRETRAINED[NAME].path
    assert path.is_file() and len(hits) == 1
    err = capsys.readouterr().err
    assert f"downloading {NAME}" in err and "done: " in err and "\r" not in err  # plain lines: not a terminal
    assert not list(path.parent.glob(".*.part"))  # nothing half-written left behind
    # The second time comes from the cache, even with the storage gone.
    monkeypatch.setenv("VITLAB_BASE_URL", "http://127.0.0.1:9")
    assert pretrained.fetch(NAME) == path and len(hits) == 1
    vitlab.load(NAME)


def test_a_terminal_gets_a_tqdm_bar(storage, server, cache, monkeypatch, capsys):
    url, _ = server
    monkeypatch.setenv("VITLAB_BASE_URL", url)
    pretrained.fetch(NAME, progress=True)
    err = capsys.readouterr().err
    assert f"downloading {NAME}" in err and "100%" in err and "\r" in err and "done: " in err  # torch.hub's bar


def test_file_url_and_recorded_checksum(storage, cache, monkeypatch):
    root, _ = storage
    monkeypatch.setenv("VITLAB_BASE_URL", root.as_uri())
    path = pretrained.fetch(NAME, progress=False)
    digest = sha256_file(path)
    assert pretrained._recorded()[pretrained.PRETRAINED[NAME].path]["sha256"] == digest
    # A cached file that changed since is caught by the digest of its first download.
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        pretrained.fetch(NAME)


def test_the_download_is_torch_hubs_and_a_published_checksum_passes(storage, server, cache, monkeypatch):
    """The bytes come through torch.hub.download_url_to_file (from the loopback server), and
    a published sha256 that matches is accepted and recorded."""
    from dataclasses import replace

    import torch.hub

    url, hits = server
    root, _ = storage
    monkeypatch.setenv("VITLAB_BASE_URL", url)
    entry = pretrained.PRETRAINED[NAME]
    published = sha256_file(root / entry.path)
    monkeypatch.setitem(pretrained.PRETRAINED, NAME, replace(entry, sha256=published))
    calls = []
    real = torch.hub.download_url_to_file
    monkeypatch.setattr(torch.hub, "download_url_to_file", lambda *a, **k: (calls.append((a, k)), real(*a, **k))[1])
    path = pretrained.fetch(NAME, progress=False)
    assert calls and calls[0][0][0] == f"{url}/{entry.path}" and calls[0][1]["hash_prefix"] == published
    assert len(hits) == 1 and pretrained._recorded()[entry.path]["sha256"] == published
    assert path.read_bytes() == (root / entry.path).read_bytes()


def test_published_checksum_mismatch_writes_nothing(storage, cache, monkeypatch):
    from dataclasses import replace

    root, _ = storage
    monkeypatch.setenv("VITLAB_BASE_URL", root.as_uri())
    bad = replace(pretrained.PRETRAINED[NAME], sha256="0" * 64)
    monkeypatch.setitem(pretrained.PRETRAINED, NAME, bad)
    with pytest.raises(CheckpointError, match="does not match the published"):
        pretrained.fetch(NAME, progress=False)
    assert not (cache / bad.path).exists()


def test_unknown_name(cache):
    with pytest.raises(CheckpointError, match="did you mean ViT-B/16:imagenet21k"):
        vitlab.load("ViT-B/16:imagenet22k")
    assert pretrained.lookup("vit-b_16:imagenet21k").name == NAME  # spelling variants


def test_offline_fails_at_once_and_says_what_to_do(cache, monkeypatch):
    monkeypatch.setenv("VITLAB_BASE_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    start = time.time()
    with pytest.raises(CheckpointError) as e:
        vitlab.load(NAME)
    assert time.time() - start < 5
    msg = str(e.value)
    assert "put the official file (ViT-B_16.npz)" in msg
    assert str(cache / "imagenet21k" / "ViT-B_16.npz") in msg
    monkeypatch.setenv("VITLAB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="VITLAB_OFFLINE"):
        pretrained.fetch(NAME)


def test_a_file_dropped_into_the_cache_is_used(storage, cache, monkeypatch):
    root, _ = storage
    entry = pretrained.PRETRAINED[NAME]
    (cache / entry.path).parent.mkdir(parents=True)
    (cache / entry.path).write_bytes((root / entry.path).read_bytes())
    monkeypatch.setenv("VITLAB_OFFLINE", "1")
    assert vitlab.load(NAME).config.representation_size == 8


def test_registry_covers_the_paper_and_augreg():
    names = pretrained.list_pretrained()
    for model in ("ViT-B/16", "ViT-B/32", "ViT-L/16", "ViT-L/32", "R50+ViT-B/16"):
        assert f"{model}:imagenet21k" in names and f"{model}:imagenet2012" in names
    assert "ViT-H/14:imagenet21k" in names
    assert sum(n.split(":")[1].startswith("augreg") for n in names) >= 20
    for entry in pretrained.PRETRAINED.values():
        assert entry.model in vitlab.list_models(), entry.name
        assert entry.url.startswith("https://storage.googleapis.com/vit_models/") and entry.url.endswith(".npz")
        assert entry.resolution in (224, 384) and entry.num_classes in (1000, 21843)
