"""Fixtures and helpers the test files share."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
import torch

from vitlab.api import create_model
from vitlab.config import ViTConfig
from vitlab.models.vit import VisionTransformer

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
# The repository's own tooling (benchmarks/loadgen.py, report_tables.py, ...) is imported as
# its scripts import one another: by module name, from their folder.
sys.path.append(str(ROOT / "benchmarks"))


def pytest_configure(config):
    # The README runs the suite on two pytest-xdist workers (-n 2) on a 2-core machine: each
    # worker then computes on one thread, as every child process of the suite already does
    # (OMP_NUM_THREADS=1), so that two workers never fight over one core's OpenMP threads.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def perturb(model: torch.nn.Module, seed: int = 0, scale: float = 0.05) -> torch.nn.Module:
    """Move every parameter off its initial value (norm weights off 1, biases off 0), so that
    a dropped or misplaced tensor shows in the outputs. Returns the model in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def logits(model: torch.nn.Module, x: torch.Tensor, float64: bool = True) -> torch.Tensor:
    """The model's logits for x (a peer's output object unwrapped). In float64 by default:
    comparing two implementations then tests the function they compute, not the order in
    which their fp32 kernels happen to round."""
    if float64:
        model, x = model.double(), x.double()
    with torch.no_grad():
        out = model(x)
    out = getattr(out, "logits", out)
    if float64:
        model.float()
    return out


TINY = dict(name="tiny", image_size=16, patch_size=4, hidden_size=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)


def tiny_config(**overrides) -> ViTConfig:
    """A ViT small enough to build and run in milliseconds: 16 px, 4 px patches, width 32."""
    return ViTConfig(**{**TINY, **overrides})


def tiny_bit(**overrides) -> torch.nn.Module:
    """A BiT ResNet with every kind of unit that runs in a fraction of a second: BiT-R26-C
    (half width, 32 px), 5 classes, a Xavier head, perturbed; the stem and sizes may change."""
    return perturb(create_model("BiT-R26-C", **{"num_classes": 5, "head_init": "xavier", **overrides}))


def tiny_model(seed: int = 0, class_names=None, **overrides) -> VisionTransformer:
    """A freshly initialised tiny ViT (seeded), in eval mode, optionally with class names."""
    torch.manual_seed(seed)
    model = VisionTransformer(tiny_config(**overrides)).eval()
    model.class_names = class_names
    return model


@pytest.fixture
def tiny_checkpoint(tmp_path) -> Path:
    """A vitlab checkpoint of a perturbed tiny model with named classes."""
    import vitlab

    model = perturb(tiny_model(class_names=[f"class {i}" for i in range(10)]))
    path = tmp_path / "tiny.safetensors"
    vitlab.save(model, path)
    return path


# `vitlab train` on the built-in digits, cut short: a real trained checkpoint in ~10 s.
DIGITS_RUN = ["--steps", "40", "--ckpt-every", "40", "--quiet", "model.depth=2", "model.hidden_size=32",
              "model.num_heads=2", "model.mlp_dim=64", "data.num_workers=0", "train.log_every=10"]


@pytest.fixture(scope="session")
def tfds_root(tmp_path_factory):
    """The tfds data_dirs tfds_fixtures.py writes with tensorflow-datasets' own builders (the
    test extra), built once for all workers of the session in a process of its own: no test
    worker imports TensorFlow. -> (data_dir, what tfds itself reads back)."""
    import json
    import shutil

    from filelock import FileLock

    pytest.importorskip("tensorflow_datasets")  # its builders need TensorFlow (tensorflow-cpu)
    shared = tmp_path_factory.getbasetemp()  # this session's; under xdist, the one above each worker's
    shared = shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared
    out = shared / "tfds-fixtures"
    with FileLock(str(shared / "tfds-fixtures.lock")):
        if not (out / "expected.json").is_file():
            shutil.rmtree(out, ignore_errors=True)
            env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
            done = subprocess.run([sys.executable, str(ROOT / "tests" / "tfds_fixtures.py"), str(out)], env=env,
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr[-3000:]
    return out / "data", json.loads((out / "expected.json").read_text())


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory) -> Path:
    """The run folder of a short real training on digits (shared by every test that reads it:
    treat it as read-only)."""
    out = tmp_path_factory.mktemp("digits") / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "vitlab", "train", "--out", str(out), *DIGITS_RUN],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.fixture
def cifar_dir() -> Path:
    """The CIFAR-10 WebDataset shards of ../shared/data, or a skip saying where they were looked for."""
    path = SHARED_DATA / "cifar10"
    if not any(path.glob("train-*.tar*")):
        pytest.skip(f"needs the CIFAR-10 shards in {path}")
    return path


# The reliability suite (tests/test_reliability_*.py) -----------------------------------------
def vitlab_cli(*args: str, cwd=None, timeout: float = 180, preexec_fn=None, env=None) -> subprocess.CompletedProcess:
    """`python -m vitlab ARGS` in a child process (for what needs one: a signal, a resource
    limit, a hang, two processes at once)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "vitlab", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, preexec_fn=preexec_fn, env=env)


def assert_one_line_error(rc: int, err: str, command: str, code: int = 2, mentions: tuple[str, ...] = ()) -> str:
    """A refusal as vitlab promises it: exit status `code`, no traceback, and exactly one line
    of error on stderr (warnings may come before it), naming what it says it names."""
    assert rc == code, f"exit {rc}, expected {code}; stderr:\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("vitlab: warning:")]
    assert len(lines) == 1 and lines[0].startswith(f"vitlab {command}: error: "), err[-3000:]
    for word in mentions:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    return lines[0]


def tree_state(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, tuple[str, int]]:
    """Every file under `root` (but under `skip`): relative path -> (sha1 of the bytes, mode).
    Compared before and after a case: nothing outside the target may change."""
    import hashlib

    out = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_file() and not p.is_symlink() and not any(p == s or s in p.parents for s in skip):
            out[str(p.relative_to(root))] = (hashlib.sha1(p.read_bytes()).hexdigest(), p.stat().st_mode & 0o777)
    return out


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face Hub cache in huggingface_hub's layout, offline: HF_HUB_CACHE and
    HF_HUB_OFFLINE=1 in the environment, and in huggingface_hub's constants (which it reads
    at import) so that timm, called from the same process, reads it too. `.add(repo, files)`
    fills it (see hub_standin.HubCache)."""
    from hub_standin import HubCache

    root = tmp_path / "hf-cache"
    root.mkdir()
    _point_hub_at(monkeypatch, root, offline=True)
    return HubCache(root)


@pytest.fixture
def standin_hub(tmp_path, monkeypatch):
    """A local stand-in of the Hub's HTTP API (hub_standin.StandInHub), online, with an
    empty cache and HF_TOKEN set; HF_ENDPOINT points at it."""
    from hub_standin import StandInHub

    root = tmp_path / "hf-cache"
    root.mkdir()
    _point_hub_at(monkeypatch, root, offline=False)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    with StandInHub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)  # vitlab reads it per call and passes it on
        yield server


def _point_hub_at(monkeypatch, root: Path, offline: bool) -> None:
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.delenv("VITLAB_OFFLINE", raising=False)
    monkeypatch.delenv("VITLAB_BASE_URL", raising=False)
    monkeypatch.setenv("VITLAB_CACHE", str(root.parent / "vitlab-cache"))  # no official .npz cached


# Serving (tests/test_serve_*.py, tests/test_cli_serve.py) ---------------------------------
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def small_classifier(seed: int = 0, **overrides):
    """A small ViT (32x32 px, 8x8 patches: 16 tokens + class token) with CIFAR-10's class
    names, its weights perturbed off their initial values so that every class gets a score."""
    import vitlab
    from vitlab.config import ViTConfig

    torch.manual_seed(seed)
    settings = dict(name="ViT-test/8", image_size=32, patch_size=8, hidden_size=32, depth=2, num_heads=2,
                    mlp_dim=64, num_classes=10, head_init="xavier")
    model = perturb(vitlab.VisionTransformer(ViTConfig(**{**settings, **overrides})), seed=seed, scale=0.2)
    model.class_names = list(CIFAR_CLASSES)
    return model


@pytest.fixture(scope="session")
def classifier_checkpoint(tmp_path_factory) -> Path:
    """`small_classifier()` saved as a vitlab checkpoint."""
    import vitlab

    path = tmp_path_factory.mktemp("serve") / "small.safetensors"
    vitlab.save(small_classifier(), path)
    return path


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_claiming(width: int, height: int) -> bytes:
    """The start of a PNG that claims width x height pixels (1-bit grey): its header and an
    empty first data chunk, without a pixel; a reader learns the size and nothing more."""
    return _png_start(width, height) + _png_chunk(b"IDAT", b"")


def _png_start(width: int, height: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))


def zero_png(width: int, height: int) -> bytes:
    """A complete, valid 1-bit PNG of width x height black pixels: a few KB on disk for any size
    (rows of zeros compress ~1000:1), which is what a decompression bomb looks like."""
    packer, row = zlib.compressobj(9), b"\x00" * (1 + (width + 7) // 8)  # filter byte + packed bits
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    return _png_start(width, height) + _png_chunk(b"IDAT", data) + _png_chunk(b"IEND", b"")


def cifar_test_images(shards: Path, count: int) -> list[tuple[str, bytes, int]]:
    """The first `count` (name, JPEG bytes, class index) of the CIFAR-10 test shards."""
    from vitlab.data.tar_shards import iter_shard

    out = []
    for key, parts in iter_shard(sorted(shards.glob("test-*.tar*"))[0]):
        ext = "jpg" if "jpg" in parts else "png"
        out.append((f"{Path(key).name}.{ext}", parts[ext], int(parts["cls"].decode())))
        if len(out) == count:
            break
    return out


@contextlib.contextmanager
def unchanged(root: Path, skip: tuple[Path, ...] = ()):
    """The block creates, changes and removes no file under `root` (but under `skip`)."""
    before = tree_state(root, skip)
    yield
    assert tree_state(root, skip) == before


PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2  # linux/prctl.h, linux/capability.h


def obey_permissions() -> None:
    """preexec_fn for a child that obeys file permissions even when the tests run as root (CI
    does): the capabilities that let root write anywhere leave the bounding set, so the
    python the child execs does not have them. Not root: nothing to drop."""
    if os.geteuid() != 0:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) refused")


@pytest.fixture
def read_only(tmp_path) -> Path:
    """An empty folder with mode 0555 that a child started with `obey_permissions` cannot
    write into; a skip where this machine cannot make one (no capability to drop)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        probe = subprocess.run([sys.executable, "-c", f"open({str(folder / 'x')!r}, 'w')"], capture_output=True,
                               text=True, timeout=60, preexec_fn=obey_permissions)
    except subprocess.SubprocessError as e:
        pytest.skip(f"cannot start a child without root's file capabilities: {e}")
    if "PermissionError" not in probe.stderr:
        pytest.skip("a folder of mode 0555 is writable here even without root's file capabilities")
    yield folder
    for p in [folder, *folder.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)


@contextlib.contextmanager
def live_server(app, timeout: float = 60.0):
    """Run an ASGI app with uvicorn on a free port of 127.0.0.1, in a thread; yields its URL
    once `/health` answers 200."""
    import urllib.error
    import urllib.request

    import uvicorn

    sock = socket.create_server(("127.0.0.1", 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as `vitlab serve` does (cli/serve.py)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                break
        except (urllib.error.URLError, ConnectionError):
            pass
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not become ready"
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
