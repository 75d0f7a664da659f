"""Reliability of what comes from elsewhere (issue 23): Hub names and Hub cache files read
through vitlab's own checks, optional extras checked as whole groups, the Python API fed
what PyTorch users pass, and serve's API key compared as the bytes a client sends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import vitlab
from conftest import ROOT, assert_one_line_error, small_classifier, tiny_model, unchanged
from vitlab.checkpoints import hub
from vitlab.checkpoints.io import CheckpointError
from vitlab.cli import main
from vitlab.extras import EXTRAS, MissingExtraError, require

FUZZ = settings(max_examples=int(os.environ.get("VITLAB_FUZZ_EXAMPLES", "25")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# Hub names: validated before any lookup -------------------------------------------------------
@pytest.mark.parametrize("name", ["hf-hub:../x", "hf-hub:org/..", "hf-hub:../../etc", "hf-hub:org/a..b",
                                  "timm:../../x", "hf-hub:org/na me", "hf-hub:org/x@../../refs", "hf-hub:-org/x",
                                  "hf-hub:org/x.git", "hf-hub:org\\x", "timm:" + "x" * 120, "hf-hub:org/x@"])
def test_hostile_hub_names_are_refused_before_any_lookup(tmp_path, monkeypatch, capsys, name):
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="not a Hub model name"):
        vitlab.load(name)
    assert_one_line_error(main(["info", name]), capsys.readouterr().err, "info", mentions=("not a Hub model name",))
    assert not cache.exists()  # nothing looked up, nothing made


@given(st.text(max_size=60))
@settings(max_examples=200, deadline=None)
def test_any_hub_name_is_a_repo_of_plain_words_or_refused(rest):
    try:
        repo = hub.parse_hub_name("hf-hub:" + rest)
    except CheckpointError:
        return
    parts = repo.repo_id.split("/")
    assert 1 <= len(parts) <= 2 and all(p and p not in (".", "..") and ".." not in p for p in parts)
    assert all(c.isalnum() and c.isascii() or c in "._-" for c in repo.repo_id.replace("/", ""))


# Hub cache files: one CheckpointError naming the file -----------------------------------------
def _hf_files(tmp_path) -> dict[str, bytes]:
    from hub_standin import hf_repo_files

    return hf_repo_files(tmp_path, num_classes=3)[0]


@pytest.mark.parametrize("config, words", [
    (b"\xff\xfe{not utf-8", "config.json"),
    (b"[1, 2, 3]", "config.json"),
    (b'"a string"', "config.json"),
    (b"{broken", "config.json"),
])
def test_a_damaged_cached_config_is_one_error_naming_it(hub_cache, tmp_path, capsys, config, words):
    hub_cache.add("org/model", {**_hf_files(tmp_path), "config.json": config})
    with pytest.raises(CheckpointError, match=words):
        vitlab.load("hf-hub:org/model")
    assert_one_line_error(main(["info", "hf-hub:org/model"]), capsys.readouterr().err, "info", mentions=(words,))


@pytest.mark.parametrize("index, words", [
    ({"weight_map": {"w": "../../../outside.safetensors"}}, "outside.safetensors"),
    ({"weight_map": {"w": "/etc/passwd"}}, "/etc/passwd"),
    ({"weight_map": {"w": "sub/model.safetensors"}}, "sub/model.safetensors"),
    ({"weight_map": ["model-1.safetensors"]}, "no weight_map"),
    ({"weight_map": {"w": 3}}, "no weight_map"),
    ([1, 2], "is a list, not a mapping"),
])
def test_a_hostile_shard_index_is_refused_before_any_fetch(hub_cache, tmp_path, index, words):
    files = _hf_files(tmp_path)
    del files["model.safetensors"]
    hub_cache.add("org/sharded", {**files, "model.safetensors.index.json": json.dumps(index).encode()})
    outside = tmp_path / "outside.safetensors"
    with unchanged(tmp_path):
        with pytest.raises(CheckpointError, match="model.safetensors.index.json") as e:
            vitlab.load("hf-hub:org/sharded")
    assert words in str(e.value) and not outside.exists()


def test_an_index_that_is_not_utf8_names_the_file(hub_cache, tmp_path):
    files = _hf_files(tmp_path)
    del files["model.safetensors"]
    hub_cache.add("org/sharded", {**files, "model.safetensors.index.json": b"\xff\xff\xff"})
    with pytest.raises(CheckpointError, match="model.safetensors.index.json: not UTF-8"):
        vitlab.load("hf-hub:org/sharded")


def test_a_ref_that_climbs_out_of_the_cache_is_no_revision(hub_cache, tmp_path):
    hub_cache.add("org/model", _hf_files(tmp_path))
    ref = hub_cache.root / "models--org--model" / "refs" / "main"
    ref.write_text("../../../../etc")
    with pytest.raises(CheckpointError, match="refs/main names no commit"):
        vitlab.load("hf-hub:org/model")


@FUZZ
@given(config=st.one_of(st.binary(max_size=200), st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12).map(lambda v: json.dumps(v).encode())),
    index=st.one_of(st.none(), st.binary(max_size=100), st.dictionaries(
        st.sampled_from(["weight_map", "metadata"]), st.one_of(st.text(max_size=40), st.dictionaries(
            st.text(max_size=8), st.text(max_size=40), max_size=3)), max_size=2).map(lambda v: json.dumps(v).encode())))
def test_fuzzed_hub_cache_layouts_load_or_raise_checkpoint_error(hub_cache, tmp_path, config, index):
    files = _fuzz_base(tmp_path)
    repo = {**files, "config.json": config}
    if index is not None:
        del repo["model.safetensors"]
        repo["model.safetensors.index.json"] = index
    name = f"org/fuzz-{abs(hash((config, index))) % 10**12}"
    hub_cache.add(name, repo)
    try:
        vitlab.load("hf-hub:" + name)
    except CheckpointError:
        pass
    assert not (tmp_path.parent / "outside.safetensors").exists()


_BASE: dict = {}


def _fuzz_base(tmp_path) -> dict[str, bytes]:
    if "files" not in _BASE:
        _BASE["files"] = _hf_files(tmp_path)
    return dict(_BASE["files"])


# Optional extras: one helper, every module of the group ---------------------------------------
def test_the_extras_table_is_pyprojects():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    groups = {k: v for k, v in declared.items() if k not in ("all", "test")}
    assert set(groups) == set(EXTRAS)
    providers = metadata.packages_distributions()
    norm = lambda n: n.lower().replace("_", "-")  # noqa: E731
    for group, requirements in groups.items():
        wanted = {norm(r.split(">")[0].split("=")[0].split("[")[0].strip()) for r in requirements}
        have = {norm(d) for m in EXTRAS[group] for d in providers.get(m, [])}
        assert wanted <= have, f"extra {group}: {wanted - have} has no module in vitlab.extras.EXTRAS[{group!r}]"


@pytest.mark.parametrize("group, module", [(g, m) for g, ms in EXTRAS.items() for m in ms])
def test_each_missing_module_of_each_group_is_named(monkeypatch, group, module):
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    with pytest.raises(MissingExtraError) as e:
        require(group, "this", modules=())
    assert module in str(e.value) and f'pip install "vitlab[{group}]"' in str(e.value)


def _without(module: str, *argv: str, cwd=None) -> subprocess.CompletedProcess:
    code = f"import sys; sys.modules[{module!r}] = None; from vitlab.cli import main; sys.exit(main({list(argv)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=cwd)


@pytest.mark.parametrize("module, argv, command, extra", [
    ("fastapi_offline", ["serve", "{ckpt}"], "serve", "serve"),
    ("prometheus_client", ["serve", "{ckpt}"], "serve", "serve"),
    ("submitit", ["sweep", "{spec}", "--launcher", "submitit-local", "--out", "{tmp}/o"], "sweep", "sweep"),
    ("wandb", ["train", "--log", "wandb", "--out", "{tmp}/r"], "train", "wandb"),
    ("huggingface_hub", ["info", "hf-hub:org/model"], "info", "hub"),
    ("datasets", ["eval", "{ckpt}", "--data", "hf:mnist"], "eval", "datasets"),
    ("onnxscript", ["export", "{ckpt}", "--format", "onnx", "--out", "{tmp}/m.onnx"], "export", "export"),
])
def test_a_half_installed_extra_is_one_line_naming_the_module(tmp_path, module, argv, command, extra):
    ckpt = tmp_path / "m.safetensors"
    vitlab.save(tiny_model(class_names=[f"c{i}" for i in range(10)]), ckpt)
    spec = tmp_path / "s.yaml"
    spec.write_text("train: {config: digits}\ngrid: {seed: [0]}\n")
    words = {"{ckpt}": str(ckpt), "{spec}": str(spec)}
    r = _without(module, *[words.get(a, a.replace("{tmp}", str(tmp_path))) for a in argv])
    assert_one_line_error(r.returncode, r.stderr, command, mentions=(module, f'pip install "vitlab[{extra}]"'))


# The Python API takes what PyTorch users pass --------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return small_classifier().eval()


def _x(seed=0):
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-5), (torch.float16, 5e-2), (torch.bfloat16, 2e-1)])
def test_float_tensors_of_any_precision_are_taken(model, dtype, atol):
    x = _x()
    with torch.no_grad():
        ref, got = model(x), model(x.to(dtype))
    assert got.dtype == torch.float32 and torch.allclose(got, ref, atol=atol)


def test_uint8_pixels_are_scaled_and_normalised_with_the_models_mean_and_std(model):
    pixels = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    mean = torch.tensor(model.config.mean).view(1, 3, 1, 1)
    std = torch.tensor(model.config.std).view(1, 3, 1, 1)
    with torch.no_grad():
        assert torch.allclose(model(pixels), model((pixels.float() / 255 - mean) / std), atol=1e-6)
        assert torch.allclose(model(pixels.numpy()), model(pixels), atol=1e-6)


def test_numpy_arrays_are_taken_like_tensors(model):
    x = _x(2)
    with torch.no_grad():
        ref = model(x)
        assert torch.allclose(model(x.numpy()), ref, atol=1e-6)
        assert torch.allclose(model(x.double().numpy()), ref, atol=1e-5)
        assert torch.allclose(model(np.asfortranarray(x.numpy())), ref, atol=1e-6)  # not contiguous


def test_a_half_precision_model_takes_float32_input(model):
    import copy

    half = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        assert half(_x()).dtype == torch.bfloat16


def test_a_bit_resnet_takes_the_same_inputs():
    from conftest import tiny_bit

    bit = tiny_bit().eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(bit(x.double()), bit(x), atol=1e-5)
        assert bit(torch.zeros(1, 3, 32, 32, dtype=torch.uint8)).shape == (1, 5)
        with pytest.raises(TypeError, match="int64"):
            bit(torch.zeros(1, 3, 32, 32, dtype=torch.long))


@pytest.mark.parametrize("value, words", [
    (torch.zeros(2, 3, 32, 32, dtype=torch.int64), "int64"),
    (torch.zeros(2, 3, 32, 32, dtype=torch.bool), "bool"),
    (torch.zeros(2, 3, 32, 32, dtype=torch.complex64), "complex64"),
    (np.zeros((2, 3, 32, 32), dtype=np.int32), "int32"),
    (np.zeros((2, 3, 32, 32), dtype=object), "object"),
    ([[0.0]], "not list"),
    (None, "not NoneType"),
    ("image.png", "not str"),
])
def test_what_cannot_be_images_is_a_type_error_saying_what_to_pass(model, value, words):
    with pytest.raises(TypeError, match=words) as e:
        model(value)
    assert "vitlab.transform" in str(e.value)


@pytest.mark.parametrize("value", [torch.zeros(2, 32, 32, 3), np.zeros((32, 32, 3), np.uint8), torch.zeros(3, 32, 32)])
def test_a_wrong_layout_is_a_value_error_from_vitlab(model, value):
    with pytest.raises(ValueError, match="NCHW image batch|input channels"):
        model(value)


@pytest.mark.parametrize("call, error", [
    (lambda: vitlab.create_model(None), TypeError),
    (lambda: vitlab.create_model(16), TypeError),
    (lambda: vitlab.create_model(["ViT-B/16"]), TypeError),
    (lambda: vitlab.create_model("ViT-Ti/16", pretrained="yes"), TypeError),
    (lambda: vitlab.create_model("ViT-Ti/16", num_classes="ten"), ValueError),
    (lambda: vitlab.create_model("ViT-Ti/16", num_classes=None), ValueError),
    (lambda: vitlab.create_model("ViT-Ti/16", image_size=-1), ValueError),
    (lambda: vitlab.create_model("ViT-Ti/16", image_size=[1, 2, 3]), ValueError),
    (lambda: vitlab.create_model("ViT-Ti/16", patch_size=0.5), ValueError),
    (lambda: vitlab.create_model("ViT-Ti/16", no_such_setting=1), ValueError),
    (lambda: vitlab.create_model("no such model"), ValueError),
    (lambda: vitlab.get_config(None), TypeError),
    (lambda: vitlab.load(None), TypeError),
    (lambda: vitlab.load(3.5), TypeError),
    (lambda: vitlab.load("x.safetensors", format=3), TypeError),
    (lambda: vitlab.save(None, "x.safetensors"), TypeError),
    (lambda: vitlab.save(small_classifier(), None), TypeError),
    (lambda: vitlab.list_models(3), TypeError),
    (lambda: vitlab.transform(None), TypeError),
])
def test_wrong_arguments_are_errors_from_vitlab(call, error):
    with pytest.raises(error) as e:
        call()
    where = e.traceback[-1].path
    assert "vitlab" in str(where) and "torch" not in str(where), f"raised from {where}"


# serve --api-key: the bytes a client sends ---------------------------------------------------------
KEY = "clé-secrète-ключ-🔑"


@pytest.fixture(scope="module")
def keyed_server(model):
    pytest.importorskip("fastapi_offline")
    from conftest import live_server
    from vitlab.config import ServeConfig
    from vitlab.serve import Engine, create_app

    with live_server(create_app(Engine(model, "fp32"), ServeConfig(api_key=KEY))) as url:
        yield url


def _png(tmp_path) -> Path:
    from PIL import Image

    path = tmp_path / "x.png"
    Image.new("RGB", (40, 30), (200, 10, 90)).save(path)
    return path


@pytest.mark.skipif(not shutil.which("curl"), reason="needs curl")
@pytest.mark.parametrize("key, status", [(KEY, "200"), (KEY[:-1], "401"), (KEY.encode().decode("latin-1"), "401")])
def test_a_non_ascii_key_sent_by_curl_is_compared_as_utf8_bytes(keyed_server, tmp_path, key, status):
    for header in ("X-API-Key: " + key, "Authorization: Bearer " + key):
        r = subprocess.run(["curl", "-s", "-o", os.devnull, "-w", "%{http_code}", "-H", header,
                            "--data-binary", f"@{_png(tmp_path)}", f"{keyed_server}/predict"],
                           capture_output=True, text=True, timeout=60)  # curl sends the header's UTF-8 as it is
        assert r.stdout == status, (header, r.stdout, r.stderr)


def test_raw_header_bytes_that_are_not_the_key_are_refused(keyed_server, tmp_path):
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(keyed_server)
    for raw, expected in ((KEY.encode(), {200}), (KEY.encode("utf-16"), {400, 401}), (b"\xff" * 8, {401})):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.putrequest("POST", "/predict")
        conn.putheader(b"X-API-Key", raw)
        body = _png(tmp_path).read_bytes()
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        assert conn.getresponse().status in expected, raw  # 400: the server refuses a NUL in a header
        conn.close()
