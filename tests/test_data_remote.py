"""WebDataset shards from http:// URLs (a loopback server) and pipe: commands: the same
samples, in the same order, as the local files; the index cached only when the server names
the version; failures named in one line."""

from __future__ import annotations

import functools
import http.server
import threading

import pytest
import torch

from conftest import SHARED_DATA
from vitlab.cli import main
from vitlab.data import DataError, open_dataset
from vitlab.data.transforms import eval_transform

CIFAR = SHARED_DATA / "cifar10"


@pytest.fixture(scope="module")
def served():
    if not (CIFAR / "test-000000.tar.gz").is_file():
        pytest.skip(f"needs the CIFAR-10 shards in {CIFAR}")
    hits = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(CIFAR)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", hits
    httpd.shutdown()
    httpd.server_close()


def first(spec: str, n: int = 40):
    ds = open_dataset(spec, "test", eval_transform(32))
    items = []
    for x, y in ds:
        items.append((x, y))
        if len(items) == n:
            break
    return ds, items


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and y == v for (x, y), (u, v) in zip(a, b, strict=True))


def test_an_http_shard_streams_the_same_samples_as_the_file(served, tmp_path, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    url, hits = served
    local_ds, local = first(f"wds:{CIFAR / 'test-000000.tar.gz'}")
    remote_ds, remote = first(f"wds:{url}/test-{{000000..000000}}.tar.gz")
    assert same(local, remote) and len(remote_ds) == len(local_ds)
    assert remote_ds.class_names == local_ds.class_names  # classes.txt beside the shards, if the folder has one
    # The server sends Last-Modified and Content-Length: the index is cached and not rebuilt.
    before = len(hits)
    open_dataset(f"wds:{url}/test-000000.tar.gz", "test", eval_transform(32))
    assert len(hits) == before + ("/classes.txt" in hits)  # no shard GET for the index


def test_a_pipe_shard_streams_the_same_samples(tmp_path, monkeypatch):
    if not (CIFAR / "test-000000.tar.gz").is_file():
        pytest.skip(f"needs the CIFAR-10 shards in {CIFAR}")
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    _, local = first(f"wds:{CIFAR / 'test-000000.tar.gz'}")
    _, piped = first(f"wds:pipe:cat {CIFAR / 'test-000000.tar.gz'}")
    assert same(local, piped)


def test_remote_failures_are_one_line(served, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    url, _ = served
    with pytest.raises(DataError, match="HTTP 404"):
        open_dataset(f"wds:{url}/missing-000000.tar", "test", eval_transform(32))
    with pytest.raises(DataError, match="exited with status"):
        open_dataset("wds:pipe:false", "test", eval_transform(32))


def test_vitlab_eval_reads_http_shards(served, digits_run, tmp_path, capsys, monkeypatch):
    import vitlab

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    url, _ = served
    model = vitlab.create_model("ViT-C/4", depth=1, hidden_size=32, num_heads=2, mlp_dim=64)
    vitlab.save(model, tmp_path / "m.safetensors")
    assert main(["eval", str(tmp_path / "m.safetensors"), "--data", f"wds:{url}/test-000000.tar.gz", "--json"]) == 0
    assert '"count"' in capsys.readouterr().out
