"""Reliability of what comes in as a stream or a string (issue 42): a shell runs only the
`pipe:` command the user typed (data/remote.py's rule), an http shard is cut off at its whole
deadline, every exception class of the Hub client becomes one line, and the Python inference
API takes numpy images as it takes PIL images and refuses NaN pixels."""

from __future__ import annotations

import http.server
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image

import vitlab
from conftest import SHARED_DATA, assert_one_line_error, tiny_model, vitlab_cli
from vitlab.checkpoints import share
from vitlab.checkpoints.io import CheckpointError
from vitlab.cli import main
from vitlab.config.fields import env_switch
from vitlab.data import DataError, open_dataset, remote
from vitlab.data.transforms import eval_transform
from vitlab.extras import hub_client_errors

FUZZ = settings(max_examples=int(os.environ.get("VITLAB_FUZZ_EXAMPLES", "40")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SHARD = SHARED_DATA / "cifar10" / "test-000000.tar.gz"


def refused(capsys, argv, command, *mentions) -> str:
    return assert_one_line_error(main([str(a) for a in argv]), capsys.readouterr().err, command, mentions=mentions)


@pytest.fixture
def shard():
    if not SHARD.is_file():
        pytest.skip(f"needs the CIFAR-10 shards in {SHARD.parent}")
    return SHARD


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "m.safetensors"
    vitlab.save(tiny_model(class_names=[f"c{i}" for i in range(10)]), path)
    return path


# A shell runs only what the user typed -------------------------------------------------------
def _marker_spec(tmp_path: Path, shard: Path) -> tuple[str, Path]:
    marker = tmp_path.parent / f"{tmp_path.name}-RAN"
    return f"wds:pipe:touch {marker}; cat {shard}", marker


SOURCES = ("recipe", "run config.yaml", "sweep train data", "sweep after-step data")


@pytest.mark.parametrize("source", SOURCES)
def test_a_pipe_command_from_a_file_runs_nothing(tmp_path, capsys, monkeypatch, shard, source):
    """A `pipe:` data spec from a recipe, a run's config.yaml or a sweep spec runs no shell
    command: one line that says how to allow it, and the command's marker never appears."""
    monkeypatch.delenv(remote.ALLOW_ENV, raising=False)
    spec, marker = _marker_spec(tmp_path, shard)
    tiny = {"name": "ViT-C/4", "depth": 1, "hidden_size": 16, "num_heads": 2, "mlp_dim": 32}
    recipe = {"model": tiny, "data": {"name": spec, "eval_data": f"wds:{shard}", "num_workers": 0},
              "train": {"steps": 1, "batch_size": 8}}
    path = tmp_path.parent / f"{tmp_path.name}-file.yaml"
    if source == "recipe":
        path.write_text(yaml.safe_dump(recipe))
        argv, command = ["train", "--config", path, "--out", tmp_path / "run"], "train"
    elif source == "run config.yaml":
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(recipe))
        argv, command = ["train", "--resume", tmp_path / "run", "--steps", "2"], "train"
        (tmp_path / "run" / "checkpoints").mkdir()
        (tmp_path / "run" / "checkpoints" / "last.safetensors").write_bytes(b"")
    else:
        train = {"config": "digits", "steps": 1, **({"data": spec} if source == "sweep train data" else {})}
        after = {"fewshot": {"command": f"fewshot {{checkpoint}} --data '{spec}'", "result": "f.json"}}
        path.write_text(yaml.safe_dump({"train": train, "grid": {"seed": [0]},
                                        "after": after if source == "sweep after-step data" else {}}))
        argv, command = ["sweep", path, "--out", tmp_path / "sweep"], "sweep"
    refused(capsys, argv, command, "pipe:touch", "not on this command line", "--allow-pipe", remote.ALLOW_ENV)
    assert not marker.exists()


def test_a_pipe_command_runs_when_typed_or_allowed(tmp_path, monkeypatch, shard):
    monkeypatch.delenv(remote.ALLOW_ENV, raising=False)
    spec, marker = _marker_spec(tmp_path, shard)
    argv = ["eval", "m.safetensors", "--data", "wds:pipe:cat x"]
    with remote.command_line_rule(argv):
        with pytest.raises(DataError, match="not on this command line"):
            open_dataset(spec, "test", eval_transform(32))
        assert not marker.exists()
    monkeypatch.setenv(remote.ALLOW_ENV, "1")  # the environment switch, read when the command starts
    with remote.command_line_rule(argv):
        assert len(open_dataset(spec, "test", eval_transform(32))) > 0 and marker.exists()
    monkeypatch.delenv(remote.ALLOW_ENV)
    marker.unlink()
    for argv, allow in (([f"--data={spec}"], False), ([f"data.name={spec}"], False), ([], True)):
        with remote.command_line_rule(argv, allow=allow):  # typed on the command line, or --allow-pipe
            open_dataset(spec, "test", eval_transform(32))
        assert marker.exists()
        marker.unlink()


@FUZZ
@given(typed=st.lists(st.text(max_size=12), max_size=4), command=st.text(max_size=12), allow=st.booleans())
def test_the_rule_runs_exactly_the_typed_commands(typed, command, allow):
    argv = [f"--data=wds:pipe:{c}" for c in typed]
    with remote.command_line_rule(argv, allow=allow):
        runs = True
        try:
            remote.check_command(command)
        except DataError:
            runs = False
    assert runs == (allow or command in typed or env_switch(remote.ALLOW_ENV))


def _small_shard(shard: Path, folder: Path, samples: int = 48) -> Path:
    """The first samples of a CIFAR-10 shard as a shard of their own (a short evaluation)."""
    import tarfile

    small = folder / "test-000000.tar"
    with tarfile.open(shard) as src, tarfile.open(small, "w") as dst:
        for member in src:
            dst.addfile(member, src.extractfile(member))  # a .jpg and a .cls per sample
            if len(dst.getmembers()) >= 2 * samples:
                break
    return small


def test_a_recipes_pipe_runs_only_with_allow_pipe_in_a_fresh_process(tmp_path, shard):
    small = _small_shard(shard, tmp_path)
    spec, marker = _marker_spec(tmp_path, small)
    recipe = tmp_path.parent / f"{tmp_path.name}-r.yaml"
    recipe.write_text(yaml.safe_dump({
        "model": {"name": "ViT-C/4", "depth": 1, "hidden_size": 16, "num_heads": 2, "mlp_dim": 32},
        "data": {"name": spec, "eval_data": f"wds:{small}", "num_workers": 0, "classes": [f"c{i}" for i in range(10)]},
        "train": {"steps": 1, "batch_size": 8}}))
    env = {remote.ALLOW_ENV: ""}
    r = vitlab_cli("train", "--config", str(recipe), "--out", str(tmp_path / "a"), "--quiet", env=env)
    assert_one_line_error(r.returncode, r.stderr, "train", mentions=("--allow-pipe",))
    assert not marker.exists()
    r = vitlab_cli("train", "--config", str(recipe), "--out", str(tmp_path / "b"), "--quiet", "--allow-pipe", env=env)
    assert r.returncode == 0 and marker.exists(), r.stderr[-2000:]


# An http shard has a whole deadline ------------------------------------------------------------
class _Server:
    """A loopback server whose GET sends `head` bytes of the shard at once, then one byte per
    `every` seconds (a trickle that is never silent for long), or nothing more (a stall)."""

    def __init__(self, data: bytes, head: int, every: float):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data[:head])
                    for i in range(head, len(data)):
                        if outer.closed or every < 0:
                            break
                        time.sleep(every)
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                    while every < 0 and not outer.closed:
                        time.sleep(0.05)  # a stall: the connection open, nothing sent
                except OSError:
                    pass

            def do_HEAD(self):
                self.send_response(404)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.closed = False
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/test-000000.tar.gz"

    def close(self):
        self.closed = True
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("kind,head,every,words", [
    ("a byte now and then", 2000, 0.2, "slower than"),
    ("a stall after the first bytes", 2000, -1, "timed out"),
    ("the whole shard at once", None, 0.0, None),
])
def test_an_http_shard_meets_its_deadline_or_is_cut_off(tmp_path, monkeypatch, shard, kind, head, every, words):
    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VITLAB_HTTP_TIMEOUT", "1")
    monkeypatch.setenv("VITLAB_HTTP_MIN_RATE", "2000")
    data = shard.read_bytes()
    server = _Server(data, len(data) if head is None else head, every)
    try:
        started = time.monotonic()
        if words is None:
            assert len(open_dataset(f"wds:{server.url}", "test", eval_transform(32))) > 0
            return
        with pytest.raises(DataError, match=words):
            open_dataset(f"wds:{server.url}", "test", eval_transform(32))
        assert time.monotonic() - started < 15  # the 1 s grace, the rate, one socket read: not forever
    finally:
        server.close()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "fast"])
def test_bad_deadline_settings_are_one_line(monkeypatch, value):
    monkeypatch.setenv("VITLAB_HTTP_MIN_RATE", value)
    with pytest.raises(DataError, match="VITLAB_HTTP_MIN_RATE"):
        remote.limits()


def test_a_trickling_server_is_cut_off_in_a_fresh_process(tmp_path, ckpt, shard):
    data = shard.read_bytes()
    server = _Server(data, 2000, 0.2)
    try:
        r = vitlab_cli("eval", str(ckpt), "--data", f"wds:{server.url}", timeout=120,
                       env={"VITLAB_HTTP_TIMEOUT": "2", "VITLAB_CACHE": str(tmp_path / "cache")})
        assert_one_line_error(r.returncode, r.stderr, "eval", mentions=(server.url, "stalling"))
    finally:
        server.close()


# Every error of the Hub client is one line ---------------------------------------------------
def _instance(cls: type) -> BaseException:
    e = cls.__new__(cls)
    BaseException.__init__(e, "boom")
    return e


def test_the_hub_errors_come_from_the_client_it_uses():
    classes = hub_client_errors()
    from huggingface_hub import errors

    http_library = {b.__module__.split(".")[0] for b in errors.HfHubHTTPError.__mro__} - {"huggingface_hub", "builtins"}
    assert http_library and all(any(c.__module__.startswith(m) for c in classes) for m in http_library)
    assert errors.HfHubHTTPError in classes and OSError in classes and len(classes) > 30


def test_every_hub_client_error_during_push_is_one_line(monkeypatch):
    """Each exception class of the installed Hub client and of its HTTP library (a table built
    from the library itself, so a new version's classes are in it), raised where push calls the
    Hub, ends as one CheckpointError line."""
    pytest.importorskip("huggingface_hub")
    from huggingface_hub import HfApi

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("VITLAB_OFFLINE", raising=False)
    model, escaped = tiny_model(class_names=[f"c{i}" for i in range(10)]), []
    for cls in hub_client_errors():
        def fail(*args, cls=cls, **kwargs):
            raise _instance(cls)

        monkeypatch.setattr(HfApi, "create_repo", fail)
        try:
            share.push(model, "me/model", token="hf_x")
        except CheckpointError as e:
            if "upload to me/model failed" not in str(e) or "\n" in str(e):
                escaped.append(f"{cls.__name__}: {e}")
        except BaseException as e:  # noqa: BLE001 - what the test is looking for
            escaped.append(f"{cls.__name__} escaped as {type(e).__name__}")
    assert not escaped, escaped


def test_every_hub_client_error_during_a_hub_read_is_one_line(monkeypatch, tmp_path):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from vitlab.checkpoints import hub

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hub, "offline", lambda: False)
    monkeypatch.setattr(hub, "reachable", lambda endpoint: True)
    escaped = []
    for cls in hub_client_errors():
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, cls=cls, **k: (_ for _ in ()).throw(_instance(cls)))
        try:
            hub.fetch_file(hub.HubRepo("org/model"), "config.json")
        except CheckpointError as e:
            if "\n" in str(e):
                escaped.append(f"{cls.__name__}: {e}")
        except BaseException as e:  # noqa: BLE001 - what the test is looking for
            escaped.append(f"{cls.__name__} escaped as {type(e).__name__}")
    assert not escaped, escaped


def test_push_to_a_closed_port_is_one_line_in_a_fresh_process(tmp_path, ckpt):
    r = vitlab_cli("push", str(ckpt), "--repo", "me/model", env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "hf_x",
                                                                 "HF_HUB_OFFLINE": "0"})
    assert_one_line_error(r.returncode, r.stderr, "push", mentions=("upload to me/model failed", "127.0.0.1:9"))


# The Python inference API on odd inputs -----------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return tiny_model(image_size=16, class_names=[f"c{i}" for i in range(10)])


@FUZZ
@given(h=st.integers(1, 40), w=st.integers(1, 40), channels=st.sampled_from([0, 1, 3, 4]), seed=st.integers(0, 2**16))
def test_a_numpy_image_is_preprocessed_as_the_pil_image_it_is(model, h, w, channels, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (h, w) if channels == 0 else (h, w, channels), dtype=np.uint8)
    pil = Image.fromarray(a[..., 0] if channels == 1 else a)
    transform = vitlab.transform(model)
    assert torch.equal(transform(a), transform(pil))
    assert torch.equal(transform(a / 255.0), transform(pil))  # float pixels in [0, 1], read as the 8-bit image
    assert vitlab.transform(model, train=True)(a).shape == transform(pil).shape


@pytest.mark.parametrize("image,error,words", [
    (np.zeros((3, 16, 16), np.uint8), ValueError, "(C, H, W) array"),
    (np.zeros((16, 16, 3), np.int64), TypeError, "int64"),
    (np.full((16, 16, 3), 2.0), ValueError, "0 to 1"),
    (np.full((16, 16, 3), np.nan), ValueError, "NaN"),
    (torch.full((3, 16, 16), float("nan")), ValueError, "NaN"),
    (torch.full((3, 16, 16), float("inf")), ValueError, "NaN or infinite"),
    (torch.zeros((3, 16, 16), dtype=torch.int64), TypeError, "int64"),
    ([[0, 1], [2, 3]], TypeError, "not list"),
    (None, TypeError, "not NoneType"),
    ("cat.png", TypeError, "read_image"),
])
def test_odd_images_are_refused_by_the_transform_and_the_predictor(model, image, error, words):
    for train in (False, True):
        with pytest.raises(error, match=re_words(words)):
            vitlab.transform(model, train=train)(image)
    predictor = vitlab.Predictor(model)
    if isinstance(image, str):
        return  # a string is a file for the predictor
    with pytest.raises(error, match=re_words(words)):
        list(predictor.predict([image]))
    seen = []
    list(predictor.predict([image, np.zeros((16, 16, 3), np.uint8)], on_error=lambda item, e: seen.append(e)))
    assert len(seen) == 1 and isinstance(seen[0], error)


def re_words(words: str) -> str:
    import re

    return re.escape(words)


def test_a_prepared_batch_with_nan_is_refused_by_number(model):
    predictor = vitlab.Predictor(model)
    x = torch.zeros(3, 3, 16, 16)
    x[2, 0, 0, 0] = float("nan")
    for call in (predictor.classify, predictor.look):
        with pytest.raises(ValueError, match="image 2 of the batch"):
            call(x)
    rows = list(predictor.predict([np.zeros((16, 16, 3), np.uint8)], attention=True))
    assert np.isfinite(rows[0]["probabilities"]).all() and rows[0]["predictions"][0]["class"].startswith("c")


def test_the_issues_examples_in_a_fresh_process(tmp_path):
    script = tmp_path.parent / f"{tmp_path.name}-api.py"
    script.write_text(
        "import numpy as np, torch, vitlab\n"
        "m = vitlab.create_model('ViT-C/4', depth=1, hidden_size=16, num_heads=2, mlp_dim=32, num_classes=3)\n"
        "a = np.zeros((20, 20, 3), np.uint8)\n"
        "x = vitlab.transform(m)(a)\n"
        "assert isinstance(x, torch.Tensor) and x.shape == (3, 32, 32)\n"
        "p = vitlab.Predictor(m)\n"
        "print(next(iter(p.predict([a])))['predictions'][0]['class'])\n"
        "try:\n"
        "    list(p.predict([torch.full((3, 32, 32), float('nan'))]))\n"
        "except ValueError as e:\n"
        "    print('refused:', e)\n")
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[0] == "class 0" or r.stdout.splitlines()[0].startswith("class ")
    assert "refused: the image tensor holds NaN" in r.stdout
