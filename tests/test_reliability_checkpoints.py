"""Reliability: checkpoints that are truncated, corrupted, inconsistent or not files at all
are refused in one line; conversions are proven on logits; --force replaces only vitlab's
files. The readers are fuzzed (hypothesis) with mutated files of every format."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import vitlab
from conftest import assert_one_line_error, tiny_model, tree_state, unchanged, vitlab_cli
from vitlab.checkpoints import CheckpointError
from vitlab.cli import main

# VITLAB_FUZZ_EXAMPLES raises the count for a longer hunt; CI keeps it small.
FUZZ = settings(max_examples=int(os.environ.get("VITLAB_FUZZ_EXAMPLES", "25")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# (format, file or folder name): one of each, written by vitlab from the same tiny model.
WRITTEN = {"vitlab": "m.safetensors", "npz": "m.npz", "timm": "m_timm.safetensors", "hf": "m_hf",
           "torchvision": "m_tv.safetensors"}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A tiny exact-GELU model in every format (exact GELU: torchvision and timm compute it)."""
    folder = tmp_path_factory.mktemp("written")
    model = tiny_model(class_names=[f"c{i}" for i in range(10)], gelu="exact")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fmt, name in WRITTEN.items():
            vitlab.save(model, folder / name, fmt, **({} if fmt == "vitlab" else {"allow_numerics_change": True}))
    return folder, model


def one_file(written, fmt: str):
    folder, _ = written
    path = folder / WRITTEN[fmt]
    return path / "model.safetensors" if fmt == "hf" else path


def load_fails_cleanly(path, fmt=None) -> str:
    """vitlab.load raises CheckpointError (or FileNotFoundError), nothing else; its message."""
    with pytest.raises((CheckpointError, FileNotFoundError)) as err:
        vitlab.load(path, format=fmt)
    return str(err.value)


# Truncated, corrupted, empty, not a file -------------------------------------------------------
@pytest.mark.parametrize("fmt", list(WRITTEN))
@pytest.mark.parametrize("keep", [0.0, 0.01, 0.5, 0.99])
def test_truncated_files_of_every_format_are_refused(tmp_path, written, fmt, keep):
    folder, _ = written
    source = one_file(written, fmt)
    blob = source.read_bytes()[: int(len(source.read_bytes()) * keep)]
    if fmt == "hf":
        target = tmp_path / "hf"
        target.mkdir()
        for p in (folder / WRITTEN[fmt]).iterdir():
            (target / p.name).write_bytes(p.read_bytes())
        (target / "model.safetensors").write_bytes(blob)
    else:
        target = tmp_path / source.name
        target.write_bytes(blob)
    message = load_fails_cleanly(target, fmt)
    assert str(target) in message or "model.safetensors" in message


@FUZZ
@given(data=st.data())
def test_fuzzed_bytes_never_crash_a_reader(tmp_path, written, data):
    """Every format, its file with random bytes changed, cut or appended: the reader loads it
    (a flip inside a tensor's numbers is still a file) or raises CheckpointError, never another
    exception and never a hang."""
    fmt = data.draw(st.sampled_from(list(WRITTEN)))
    blob = bytearray(one_file(written, fmt).read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    name = "model.safetensors" if fmt == "hf" else WRITTEN[fmt]
    folder = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example: hypothesis shares tmp_path
    if fmt == "hf":
        for p in (written[0] / WRITTEN["hf"]).iterdir():
            (folder / p.name).write_bytes(p.read_bytes())
    target = folder if fmt == "hf" else folder / name
    (folder / name).write_bytes(bytes(blob))
    try:
        vitlab.load(target, format=data.draw(st.sampled_from([None, fmt])))
    except (CheckpointError, FileNotFoundError):
        pass


@FUZZ
@given(config=st.dictionaries(st.sampled_from(["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                               "intermediate_size", "image_size", "patch_size", "num_channels",
                                               "hidden_act", "layer_norm_eps", "qkv_bias", "id2label"]),
                              st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.floats(allow_nan=True),
                                        st.text(max_size=5), st.lists(st.integers(0, 64), max_size=3),
                                        st.just("vit"), st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=2))))
def test_fuzzed_hf_configs_never_crash(tmp_path, written, config):
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    (folder / "model.safetensors").write_bytes((written[0] / WRITTEN["hf"] / "model.safetensors").read_bytes())
    (folder / "config.json").write_text(json.dumps({"model_type": "vit", **config}))
    try:
        vitlab.load(folder)
    except (CheckpointError, FileNotFoundError):
        pass


@pytest.mark.parametrize("content", [b"", b"\x00" * 7, b"not a checkpoint at all", b"PK\x03\x04garbage"])
@pytest.mark.parametrize("suffix", [".pth", ".safetensors", ".npz", ".bin"])
def test_empty_and_garbage_files(tmp_path, capsys, content, suffix):
    path = tmp_path / f"x{suffix}"
    path.write_bytes(content)
    with unchanged(tmp_path):
        load_fails_cleanly(path)
        assert main(["info", str(path)]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "info", mentions=(str(path),))


def test_a_fifo_or_a_device_is_refused_without_opening_it(tmp_path, written):
    """Opening a FIFO with no writer blocks forever: the check comes first (child processes,
    with a timeout, so that a regression fails instead of hanging the suite)."""
    fifo = tmp_path / "w.pth"
    os.mkfifo(fifo)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text((written[0] / WRITTEN["hf"] / "config.json").read_text())
    os.mkfifo(hf / "model.safetensors")
    for args in (["info", str(fifo)], ["info", str(fifo), "--format", "timm"], ["info", str(fifo), "--format", "vitlab"],
                 ["info", "/dev/zero", "--format", "npz"], ["info", str(hf)]):
        r = vitlab_cli(*args, timeout=120)
        assert_one_line_error(r.returncode, r.stderr, "info")
        assert "FIFO" in r.stderr or "device" in r.stderr or "model.safetensors" in r.stderr


# Metadata against the tensors -------------------------------------------------------------------
def rewrite(src, dst, meta_change=None, tensor_change=None) -> None:
    with safe_open(str(src), framework="pt") as f:
        meta = dict(f.metadata())
    state = load_file(str(src))
    if meta_change:
        meta_change(meta)
    if tensor_change:
        tensor_change(state)
    save_file(state, str(dst), metadata=meta)


def set_config(key, value):
    def change(meta):
        cfg = json.loads(meta["config"])
        cfg[key] = value
        meta["config"] = json.dumps(cfg)
    return change


@pytest.mark.parametrize("case, change, words", [
    ("hidden_size of 64 over 32-wide tensors", dict(meta_change=set_config("hidden_size", 64)), ("wrong shapes",)),
    ("two class names for ten classes", dict(meta_change=lambda m: m.update(class_names='["a", "b"]')), ("2 class names",)),
    ("class names not JSON", dict(meta_change=lambda m: m.update(class_names="[a, b")), ("not JSON",)),
    ("class names not strings", dict(meta_change=lambda m: m.update(class_names=json.dumps(list(range(10))))), ("list of strings",)),
    ("config not JSON", dict(meta_change=lambda m: m.update(config="{")), ("stored config is invalid",)),
    ("config with a wrong type", dict(meta_change=set_config("depth", "two")), ("depth",)),
    ("config with an unknown key", dict(meta_change=set_config("heads", 2)), ("unknown key",)),
    ("a tensor of another rank", dict(tensor_change=lambda s: s.update({"cls_token": s["cls_token"][0, 0]})), ("cls_token",)),
    ("a missing tensor", dict(tensor_change=lambda s: s.pop("norm.bias")), ("norm.bias",)),
])
def test_vitlab_metadata_is_checked_against_the_tensors(tmp_path, written, capsys, case, change, words):
    target = tmp_path / "bad.safetensors"
    rewrite(one_file(written, "vitlab"), target, **change)
    with unchanged(tmp_path):
        assert main(["info", str(target)]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "info", mentions=words)


@pytest.mark.parametrize("value, words", [(float("nan"), "NaN"), (float("inf"), "infinite")])
def test_non_finite_weights_never_predict(tmp_path, written, capsys, value, words):
    target = tmp_path / "nan.safetensors"
    rewrite(one_file(written, "vitlab"), target, tensor_change=lambda s: s["head.weight"].__setitem__((0, 0), value))
    image = tmp_path / "x.png"
    from PIL import Image

    Image.new("RGB", (16, 16), (10, 20, 30)).save(image)
    assert main(["predict", str(target), str(image)]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "predict", mentions=("head.weight", words))


def test_integer_tensors_are_refused(tmp_path, written):
    target = tmp_path / "int.safetensors"
    rewrite(one_file(written, "vitlab"), target, tensor_change=lambda s: s.update({"norm.bias": s["norm.bias"].long()}))
    assert "dtype torch.int64" in load_fails_cleanly(target)


@pytest.mark.parametrize("key, value, words", [
    ("hidden_size", None, "no 'hidden_size'"), ("num_hidden_layers", "2", "num_hidden_layers='2'"),
    ("num_attention_heads", 2.5, "num_attention_heads=2.5"), ("image_size", {"h": 16}, "image_size"),
    ("hidden_act", "relu", "hidden_act='relu'"), ("qkv_bias", "yes", "qkv_bias='yes'"), ("layer_norm_eps", "small", "layer_norm_eps"),
])
def test_hf_config_with_a_missing_key_or_a_wrong_type(tmp_path, written, capsys, key, value, words):
    folder = tmp_path / "hf"
    folder.mkdir()
    for p in (written[0] / WRITTEN["hf"]).iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    if value is None:
        del config[key]
    else:
        config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    with unchanged(tmp_path):
        assert main(["info", str(folder)]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "info", mentions=(words,))


def test_hf_preprocessor_config_that_is_broken_is_not_ignored(tmp_path, written):
    folder = tmp_path / "hf"
    folder.mkdir()
    for p in (written[0] / WRITTEN["hf"]).iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / "preprocessor_config.json").write_text('{"image_mean": [0.5, 0.5]}')
    assert "image_mean" in load_fails_cleanly(folder)


@pytest.mark.parametrize("fmt, key, shape", [
    ("npz", "embedding/kernel", (4, 4, 3)), ("npz", "Transformer/posembed_input/pos_embedding", (17,)),
    ("npz", "cls", ()), ("timm", "patch_embed.proj.weight", (32, 48)), ("timm", "pos_embed", (17,)),
    ("torchvision", "conv_proj.weight", (32,)), ("torchvision", "encoder.pos_embedding", (17, 32)),
])
def test_arrays_of_the_wrong_rank(tmp_path, written, capsys, fmt, key, shape):
    source = one_file(written, fmt)
    if fmt == "npz":
        with np.load(source) as f:
            arrays = {k: f[k] for k in f.files}
        arrays[key] = np.zeros(shape, dtype=np.float32)
        target = tmp_path / "bad.npz"
        np.savez(target, **arrays)
    else:
        state = load_file(str(source))
        state[key] = torch.zeros(shape)
        target = tmp_path / "bad.pth"
        torch.save(state, target)
    with unchanged(tmp_path):
        assert main(["info", str(target), "--format", fmt]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "info", mentions=(str(target),))


# Conversions ------------------------------------------------------------------------------------
@pytest.fixture
def tanh_heads2(tmp_path):
    """The tiny model as trained by default: tanh GELU, 2 heads of 16 (no published width)."""
    path = tmp_path / "src.safetensors"
    vitlab.save(tiny_model(class_names=[f"c{i}" for i in range(10)]), path)
    return path


@pytest.mark.parametrize("fmt, lost", [("timm", ("num_heads=2 reads back as 1", "gelu='tanh' reads back as 'exact'")),
                                       ("torchvision", ("num_heads=2 reads back as 1", "gelu='tanh'"))])
def test_a_pth_that_cannot_carry_a_setting_is_refused_or_said(tmp_path, tanh_heads2, capsys, fmt, lost):
    dst = tmp_path / "out.pth"
    before = tree_state(tmp_path)
    assert main(["convert", str(tanh_heads2), str(dst), "--to", fmt]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "convert", mentions=(str(dst), *lost))
    assert tree_state(tmp_path) == before  # nothing written, no staging left behind
    assert main(["convert", str(tanh_heads2), str(dst), "--to", fmt, "--allow-numerics-change"]) == 0
    out, err = capsys.readouterr()
    assert all(word in err for word in lost) and "will differ" in err
    assert "from the settings it does not carry" in out
    back = vitlab.load(dst, format=fmt)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # what the warning said: the reloaded model is another function
        assert (back.forward_features(x) - vitlab.load(tanh_heads2).forward_features(x)).abs().max() > 1e-3
    assert main(["convert", str(tanh_heads2), str(tmp_path / "out.safetensors"), "--to", fmt,
                 *(["--allow-numerics-change"] if fmt == "torchvision" else [])]) == 0
    assert "gives identical logits" in capsys.readouterr().out or fmt == "torchvision"


def test_a_missing_suffix_is_warned_about(tmp_path, tanh_heads2, capsys):
    assert main(["convert", str(tanh_heads2), str(tmp_path / "model.weights"), "--to", "vitlab"]) == 0
    assert "recognised by the suffix .safetensors" in capsys.readouterr().err
    assert main(["convert", str(tanh_heads2), str(tmp_path / "official"), "--to", "npz"]) == 0
    assert "suffix .npz" in capsys.readouterr().err


def test_convert_force_into_a_folder_keeps_what_vitlab_did_not_write(tmp_path, tanh_heads2, capsys):
    dst = tmp_path / "hf"
    (dst / ".git").mkdir(parents=True)
    (dst / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (dst / "README.md").write_text("# my model\n")
    (dst / "model-00001-of-00002.safetensors").write_bytes(b"stale shard of an earlier save")
    keep = tree_state(dst, skip=(dst / "model-00001-of-00002.safetensors",))
    assert main(["convert", str(tanh_heads2), str(dst), "--to", "hf"]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["convert", str(tanh_heads2), str(dst), "--to", "hf", "--force"]) == 0
    assert tree_state(dst, skip=(dst / "config.json", dst / "model.safetensors", dst / "preprocessor_config.json")) == keep
    assert not (dst / "model-00001-of-00002.safetensors").exists()  # stale weights of the format: vitlab's to replace
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left
    assert vitlab.load(dst).class_names == [f"c{i}" for i in range(10)]


def test_a_conversion_that_does_not_verify_leaves_dst_as_it_was(tmp_path, tanh_heads2, capsys, monkeypatch):
    """The written copy is checked before it replaces anything: a reader that builds another
    model (simulated) fails the check and the old file stays."""
    dst = tmp_path / "old.safetensors"
    dst.write_bytes(b"the user's earlier file")
    from vitlab import checkpoints

    real = checkpoints.load
    monkeypatch.setattr(checkpoints, "load", lambda *a, **k: perturb_loaded(real(*a, **k)))
    assert main(["convert", str(tanh_heads2), str(dst), "--force"]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "convert", mentions=("logits differ", "not written"))
    assert dst.read_bytes() == b"the user's earlier file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.safetensors", "src.safetensors"]


def perturb_loaded(model):
    with torch.no_grad():
        model.norm.weight.mul_(1.5)
    return model


def test_export_refuses_an_existing_out_without_force(tmp_path, tanh_heads2, capsys):
    out = tmp_path / "m.pt2"
    out.write_bytes(b"an earlier export")
    assert main(["export", str(tanh_heads2), "--format", "torch-export", "--out", str(out)]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "export", mentions=("exists; pass --force",))
    assert out.read_bytes() == b"an earlier export"
    assert main(["export", str(tanh_heads2), "--format", "torch-export", "--out", str(out), "--force", "--no-check"]) == 0
    assert out.read_bytes() != b"an earlier export"


def test_written_files_have_normal_permissions(tmp_path, tanh_heads2):
    old = os.umask(0o022)
    try:
        model = vitlab.load(tanh_heads2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for fmt, name in WRITTEN.items():
                vitlab.save(model, tmp_path / name, fmt, **({} if fmt == "vitlab" else {"allow_numerics_change": True}))
        vitlab.checkpoints.save_verified(model, tmp_path / "verified_hf", "hf")
    finally:
        os.umask(old)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) >= 8
    assert {p.stat().st_mode & 0o777 for p in files} == {0o644}, {str(p): oct(p.stat().st_mode & 0o777) for p in files}
    assert {p.stat().st_mode & 0o777 for p in tmp_path.rglob("*") if p.is_dir()} == {0o755}
