"""Every command as a user runs it: a fresh process of the `vitlab` console script, with its
own empty HOME and caches, on real inputs (the built-in digits, a short real training run),
checking what it writes (files, JSON contents), not only its exit status.

A test in the same process sees what earlier tests left behind (a warmed kernel, a cached
probe, an imported module); the export of a model whose first forward was the export trace
failed in every fresh process while the suite was green. `test_every_command_has_a_fresh_test`
reads `vitlab --help`'s command list and fails when a command has no test here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import DIGITS_RUN

pytestmark = pytest.mark.slow

def fresh_env(home: Path) -> dict[str, str]:
    """A new user's environment: an empty HOME and every cache under it, one thread."""
    home.mkdir(parents=True, exist_ok=True)
    caches = {"HOME": home, "XDG_CACHE_HOME": home / ".cache", "TORCH_HOME": home / ".cache" / "torch",
              "HF_HOME": home / ".cache" / "huggingface", "MPLCONFIGDIR": home / ".config" / "matplotlib",
              "VITLAB_CACHE": home / ".cache" / "vitlab"}
    drop = ("VITLAB_", "HF_", "TORCH_", "XDG_", "MPL")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**env, **{k: str(v) for k, v in caches.items()}, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def console_script() -> str:
    """The installed `vitlab` console script (the one a user types), beside this Python."""
    here = Path(sys.executable).with_name("vitlab")
    found = str(here) if here.exists() else shutil.which("vitlab")
    if not found:
        pytest.skip("the vitlab console script is not installed (pip install -e .)")
    return found


def vitlab(tmp_path: Path, *args, timeout: float = 300, ok: bool = True) -> subprocess.CompletedProcess:
    """`vitlab ARGS` in a fresh process, in tmp_path, as a new user; asserts exit 0 unless ok=False."""
    r = subprocess.run([console_script(), *map(str, args)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=timeout, env=fresh_env(tmp_path / "home"))
    if ok:
        assert r.returncode == 0, f"vitlab {' '.join(map(str, args))}: exit {r.returncode}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A short real `vitlab train` on digits, in a fresh process (the train command's test)."""
    tmp = tmp_path_factory.mktemp("fresh")
    out = tmp / "run"
    vitlab(tmp, "train", "--out", out, *DIGITS_RUN, timeout=600)
    return out


@pytest.fixture(scope="module")
def ckpt(run_dir) -> Path:
    return run_dir / "checkpoints" / "last.safetensors"


@pytest.fixture(scope="module")
def pngs(tmp_path_factory) -> list[Path]:
    """Three real digits as PNG files."""
    from PIL import Image

    from vitlab.data.datasets import digits_arrays

    images, labels = digits_arrays()["test"]
    folder = tmp_path_factory.mktemp("pngs")
    paths = []
    for i in range(3):
        paths.append(folder / f"digit{i}_{labels[i]}.png")
        Image.fromarray(np.asarray(images[i])).save(paths[-1])
    return paths


def test_train(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 40 and 0.0 <= summary["splits"]["test"]["top1"] <= 1.0
    assert (run_dir / "config.yaml").exists() and (run_dir / "metrics.jsonl").read_text().count("\n") >= 4


def test_finetune(tmp_path, ckpt):
    out = tmp_path / "ft"
    vitlab(tmp_path, "finetune", "--from", ckpt, "--data", "digits", "--steps", "4", "--lr", "0.01", "--out", out,
           "train.log_every=2", "train.threads=1", "data.num_workers=0")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and (out / "checkpoints" / "last.safetensors").exists()


def test_eval(tmp_path, ckpt):
    """The inference copy (default) and --plain give the same accuracy on the same images."""
    for flag, folder in (((), "copy"), (("--plain",), "plain")):
        vitlab(tmp_path, "eval", ckpt, "--data", "digits", "--out", tmp_path / folder, "--batch-size", "64", *flag)
    copy, plain = (json.loads((tmp_path / f / "eval-test.json").read_text()) for f in ("copy", "plain"))
    assert copy["top1"] == plain["top1"] and copy["count"] == plain["count"] > 100
    assert (tmp_path / "copy" / "confusion-test.png").stat().st_size > 1000


def test_fewshot(tmp_path, ckpt):
    vitlab(tmp_path, "fewshot", ckpt, "--data", "digits", "--shots", "1,5", "--seeds", "2", "--out", tmp_path / "f.json")
    result = json.loads((tmp_path / "f.json").read_text())
    assert result["num_classes"] == 10 and len(result["weights_sha256"]) == 64
    assert (tmp_path / "home" / ".cache" / "vitlab").exists()  # the feature cache: under this user's HOME


def test_linear_probe(tmp_path, ckpt):
    vitlab(tmp_path, "linear-probe", ckpt, "--data", "digits", "--max-iter", "50", "--out", tmp_path / "p.json")
    result = json.loads((tmp_path / "p.json").read_text())
    assert 0.0 <= result["logistic"]["test_accuracy"] <= 1.0 and result["feature_dim"] == 32


def test_inspect(tmp_path, ckpt):
    out = tmp_path / "inspect"
    vitlab(tmp_path, "inspect", ckpt, "--images", "digits", "--out", out, "--num-images", "4", "--rollout-images", "2")
    assert json.loads((out / "analysis.json").read_text()) and list(out.glob("*.png"))


def test_predict(tmp_path, ckpt, pngs):
    """The inference copy and --plain name the same classes with the same probabilities to 1e-4."""
    rows = {}
    for flag in ((), ("--plain",)):
        r = vitlab(tmp_path, "predict", ckpt, *pngs, "--json", "--top-k", "3", *flag)
        rows[flag] = json.loads(r.stdout)["results"]
    copy, plain = rows[()], rows[("--plain",)]
    assert len(copy) == 3 and [len(r["predictions"]) for r in copy] == [3, 3, 3]
    for a, b in zip(copy, plain, strict=True):
        assert [p["index"] for p in a["predictions"]] == [p["index"] for p in b["predictions"]]
        assert a["predictions"][0]["probability"] == pytest.approx(b["predictions"][0]["probability"], abs=1e-4)
    vitlab(tmp_path, "predict", ckpt, pngs[0], "--csv", tmp_path / "p.csv", "--attention", tmp_path / "maps")
    assert (tmp_path / "p.csv").read_text().count("\n") == 2 and list((tmp_path / "maps").glob("*.png"))


def test_convert(tmp_path, ckpt):
    vitlab(tmp_path, "convert", ckpt, tmp_path / "m.npz", "--to", "npz")
    vitlab(tmp_path, "convert", tmp_path / "m.npz", tmp_path / "back.safetensors")
    info = json.loads(vitlab(tmp_path, "info", tmp_path / "back.safetensors", "--json").stdout)
    assert info["params"] == json.loads(vitlab(tmp_path, "info", ckpt, "--json").stdout)["params"]


def test_info(tmp_path, ckpt):
    info = json.loads(vitlab(tmp_path, "info", ckpt, "--json").stdout)
    assert info["format"] == "vitlab" and info["params"] == 18_602 and info["config"]["depth"] == 2


@pytest.mark.parametrize("fmt", ["onnx", "torch-export"])
def test_export(tmp_path, ckpt, fmt):
    """The export is the process's first forward: checked at batch 1 and 3 within 1e-4."""
    out = tmp_path / ("m.onnx" if fmt == "onnx" else "m.pt2")
    r = vitlab(tmp_path, "export", ckpt, "--format", fmt, "--out", out)
    assert re.search(r"max \|logit diff\| \S+ vs PyTorch: ok", r.stdout), r.stdout
    assert out.stat().st_size > 10_000
    if fmt == "onnx":  # what a runtime needs beside the graph
        import onnx

        meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
        assert len(json.loads(meta["vitlab.class_names"])) == 10 and json.loads(meta["vitlab.config"])["depth"] == 2


def test_export_each_copy(tmp_path, ckpt):
    """An int8 copy saved by save_int8 exports with torch-export; ONNX refuses it in one line."""
    import vitlab as lib
    from vitlab import deploy

    deploy.save_int8(deploy.quantize_int8(lib.load(ckpt)), tmp_path / "q8.safetensors")
    r = vitlab(tmp_path, "export", tmp_path / "q8.safetensors", "--format", "torch-export", "--out", tmp_path / "q8.pt2")
    assert ": ok" in r.stdout
    r = vitlab(tmp_path, "export", tmp_path / "q8.safetensors", "--format", "onnx", "--out", tmp_path / "q8.onnx", ok=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "torch-export" in r.stderr
    assert not (tmp_path / "q8.onnx").exists()


def test_push(tmp_path, run_dir):
    folder = tmp_path / "out"
    vitlab(tmp_path, "push", run_dir, "--repo", "me/digits", "--folder", folder)
    card = (folder / "README.md").read_text()
    assert "me/digits" in card or "digits" in card
    assert list(folder.glob("*.safetensors")) and (folder / "config.json").exists()


def test_recipes(tmp_path):
    names = json.loads(vitlab(tmp_path, "recipes", "--json").stdout)
    assert "digits" in json.dumps(names)


def test_models(tmp_path):
    rows = json.loads(vitlab(tmp_path, "models", "ViT-B/16", "--json").stdout)
    assert "ViT-B/16" in json.dumps(rows) and "86" in json.dumps(rows)


def test_sweep(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "train": {"config": "digits", "steps": 2},
                                    "grid": {"seed": [0, 1]}, "report": {"metrics": ["test.top1"]}}))
    vitlab(tmp_path, "sweep", spec, "--out", tmp_path / "out", "--jobs", "1", "--threads", "1", timeout=600)
    csv = (tmp_path / "out" / "results.csv").read_text().splitlines()
    assert len(csv) == 3 and "top1" in csv[0]


def test_vtab(tmp_path, ckpt):
    from PIL import Image

    from vitlab.data.datasets import digits_arrays

    root = tmp_path / "vtab"
    d = digits_arrays()
    images, labels = np.concatenate([d["train"][0], d["test"][0]]), np.concatenate([d["train"][1], d["test"][1]])
    for split, (a, b) in {"train": (0, 800), "validation": (800, 1000), "test": (1000, 1040)}.items():
        for i in range(a, b):
            (root / "dtd" / split / str(labels[i])).mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.asarray(images[i])).save(root / "dtd" / split / str(labels[i]) / f"{i:05d}.png")
    out = tmp_path / "suite"
    vitlab(tmp_path, "vtab", ckpt, "--root", root, "--out", out, "--tasks", "dtd", "--steps", "2", "--batch-size", "8",
           "--image-size", "16", "--quiet", "data.num_workers=0", timeout=600)
    result = json.loads((out / "dtd" / "result.json").read_text())
    assert result["steps"] == 2 and result["test_images"] == 40 and 0.0 <= result["top1"] <= 1.0
    assert "DTD" in (out / "vtab.md").read_text() and (out / "vtab.csv").exists()


def test_serve(tmp_path, ckpt, pngs):
    """`vitlab serve --port 0` as a user starts it: the inference copy answers /predict."""
    proc = subprocess.Popen([console_script(), "serve", str(ckpt), "--port", "0"], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=fresh_env(tmp_path / "home"))
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "vitlab serve ended before listening"
            found = re.search(r" at (http://\S+)", line)
            url = found.group(1) if found else None
        assert url, "vitlab serve never said where it listens"
        while time.monotonic() < deadline:
            try:
                if json.loads(urllib.request.urlopen(f"{url}/health", timeout=5).read())["status"] == "ready":
                    break
            except OSError:
                pass
            time.sleep(0.2)
        request = urllib.request.Request(f"{url}/predict?top_k=2", data=pngs[0].read_bytes(), method="POST",
                                         headers={"Content-Type": "image/png"})
        answer = json.loads(urllib.request.urlopen(request, timeout=30).read())
        assert answer["precision"] == "fp32" and len(answer["results"][0]["predictions"]) == 2
    finally:
        proc.terminate()
        proc.wait(30)


def test_bench(tmp_path):
    vitlab(tmp_path, "bench", "--model", "ViT-C/4", "--batch-size", "2", "--rounds", "1", "--min-time", "0",
           "--wait-budget", "0", "--precision", "fp32", "fp32-packed", "--peers", "--out", tmp_path / "b", "--name", "x")
    csv = (tmp_path / "b" / "x.csv").read_text()
    assert "fp32-packed" in csv and (tmp_path / "b" / "x.md").exists()


def test_every_command_has_a_fresh_test(tmp_path):
    """`vitlab --help` lists the commands; each must have its test_<command> above."""
    r = vitlab(tmp_path, "--help")
    commands = set(re.findall(r"^    ([a-z][a-z-]+)(?:\s|$)", r.stdout.split("COMMAND\n", 1)[1], flags=re.M))
    here = Path(__file__).read_text()
    missing = sorted(c for c in commands if f"def test_{c.replace('-', '_')}(" not in here)
    assert not missing, f"commands without a fresh-process test here: {missing}"
    assert len(commands) >= 17
