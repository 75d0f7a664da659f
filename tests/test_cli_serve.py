"""`vitlab serve` as a process: refuses what it cannot serve before binding, listens on
127.0.0.1, survives a load test without losing a request or leaking memory, and stops
gracefully on SIGTERM."""

from __future__ import annotations

import http.client
import io
import itertools
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("uvicorn")
pytest.importorskip("fastapi_offline")

import vitlab  # noqa: E402
from conftest import small_classifier  # noqa: E402
from loadgen import run_load  # noqa: E402  (benchmarks/loadgen.py: on sys.path by conftest)
from vitlab.cli import main  # noqa: E402

VITLAB = [sys.executable, "-m", "vitlab"]


def png(seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


class Server:
    """`vitlab serve CHECKPOINT --port 0 ARGS` in a subprocess; `url` once /health says ready."""

    def __init__(self, checkpoint, *args: str, timeout: float = 90.0):
        self.proc = subprocess.Popen(
            [*VITLAB, "serve", str(checkpoint), "--port", "0", *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        deadline = time.monotonic() + timeout
        for line in self.proc.stderr:
            self.lines.append(line)
            found = re.search(r" at (http://[\d.]+:(\d+)) ", line)
            if found:
                self.url, self.port = found.group(1), int(found.group(2))
                break
        else:
            raise AssertionError("the server exited before listening:\n" + "".join(self.lines))
        threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()
        while not self.ready():
            assert time.monotonic() < deadline and self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.1)

    def ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"{self.url}/health", timeout=5).status == 200
        except OSError:
            return False

    def metric(self, name: str) -> float:
        text = urllib.request.urlopen(f"{self.url}/metrics", timeout=10).read().decode()
        return float(re.search(rf"^{re.escape(name)} (\S+)$", text, re.M).group(1))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@pytest.fixture
def server(classifier_checkpoint):
    s = Server(classifier_checkpoint)
    yield s
    s.stop()


def test_a_bad_checkpoint_is_refused_before_the_port_is_bound(tmp_path, capsys):
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x00not a checkpoint" * 100)
    with socket.create_server(("127.0.0.1", 0)) as taken:  # were the port bound first, that would be the error
        port = taken.getsockname()[1]
        assert main(["serve", str(bad), "--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert main(["serve", str(tmp_path / "missing.safetensors"), "--port", str(port)]) == 2
        missing = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.safetensors: not a checkpoint" in err and "Traceback" not in err
    assert missing.count("\n") == 1 and "no such file" in missing


def test_a_headless_checkpoint_and_bad_options_are_one_line_errors(tmp_path, capsys):
    path = tmp_path / "features.safetensors"
    vitlab.save(small_classifier(num_classes=0), path)
    assert main(["serve", str(path)]) == 2
    assert "no classification head" in capsys.readouterr().err
    for options, words in (
        (["--max-batch", "0"], "max_batch must be >= 1"),
        (["--port", "70000"], "port must be <= 65535"),
        (["--host", "localhost.example"], "is not an IP address"),
        (["--max-upload-mb", "0"], "max_upload_mb must be > 0"),
        (["--precision", "fp8"], "unknown precision 'fp8'; known: fp32, fp32-packed, bf16, fp16, int8"),
    ):
        assert main(["serve", str(path), *options]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err


def test_the_listening_socket_sends_small_answers_at_once():
    from vitlab.serve.server import bind

    with bind("127.0.0.1", 0) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)  # no Nagle wait on kept-alive connections
        assert sock.getsockname()[0] == "127.0.0.1"


def test_a_taken_port_is_a_one_line_error(classifier_checkpoint, capsys):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        assert main(["serve", str(classifier_checkpoint), "--port", str(taken.getsockname()[1])]) == 2
    err = capsys.readouterr().err
    assert "cannot listen on 127.0.0.1" in err and "--port" in err and "Traceback" not in err


@pytest.mark.slow
def test_on_this_machine_only_a_load_test_loses_no_request_and_leaks_no_memory(server):
    assert server.url.startswith("http://127.0.0.1:")  # the default: not reachable from elsewhere
    assert not any("every machine" in line for line in server.lines)
    body = png()
    ok = lambda b: len(json.loads(b)["results"][0]["predictions"]) == 5  # noqa: E731
    # The allocator's arenas grow for the first few thousand requests and then stay (measured:
    # +24, +10, +5, +0, +0 MiB per 1,000). A leak grows on every round: load in rounds of
    # 1,000 until two rounds in a row add less than 8 MiB; a leak never gets there.
    rss, answered = [server.metric("process_resident_memory_bytes")], 0
    for _ in range(10):
        load = run_load(server.port, body, concurrency=32, requests=1000, check=ok)
        assert load.statuses == {200: 1000} and load.answered == 1000 and not load.errors and load.bad_bodies == 0
        answered += 1000
        rss.append(server.metric("process_resident_memory_bytes"))
        if len(rss) >= 3 and max(rss[-1] - rss[-2], rss[-2] - rss[-3]) < 8 * 2**20:
            break
    growth = [round((b - a) / 2**20, 1) for a, b in itertools.pairwise(rss)]
    assert max(growth[-2:]) < 8, f"resident memory keeps growing (MiB per 1,000 requests: {growth})"
    assert server.metric('vitlab_requests_total{endpoint="/predict",status="200"}') == answered
    assert server.stop() == 0


def post(port: int, body: bytes, out: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/predict", body=body, headers={"Content-Type": "image/png"})
    response = conn.getresponse()
    out.append((response.status, json.loads(response.read())))


@pytest.mark.slow
def test_sigterm_finishes_the_requests_in_flight_and_exits_0(classifier_checkpoint):
    s = Server(classifier_checkpoint, "--max-wait-ms", "1500", "--max-batch", "64")  # requests wait in the batcher
    answers: list = []
    clients = [threading.Thread(target=post, args=(s.port, png(i), answers)) for i in range(6)]
    for c in clients:
        c.start()
    deadline = time.monotonic() + 30
    while s.metric("vitlab_requests_in_flight") < 7:  # the six, and this /metrics request
        assert time.monotonic() < deadline
        time.sleep(0.02)
    s.proc.send_signal(signal.SIGTERM)
    for c in clients:
        c.join(60)
    assert s.proc.wait(60) == 0, "".join(s.lines)
    assert [status for status, _ in answers] == [200] * 6
    assert all(len(a["results"][0]["predictions"]) == 5 for _, a in answers)
    assert "stopped" in s.lines[-1]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", s.port), timeout=5)
