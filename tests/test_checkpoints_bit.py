"""BiT ResNet weights (checkpoints/bit.py) in every format: vitlab's own, the official .npz
(read back by timm's own reader of it), timm's resnetv2_*_bit state dicts against timm's own
forward. Parameters are perturbed away from their initial values (norm weights off 1, biases
off 0) so that a dropped or misplaced tensor shows in the logits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import vitlab
from conftest import logits, perturb, tiny_bit
from vitlab.checkpoints import detect_format
from vitlab.checkpoints.io import CheckpointError
from vitlab.cli import main
from vitlab.models.bit import BiTResNet


# Weights: vitlab's own format ---------------------------------------------------------------
def test_vitlab_checkpoint_round_trip_and_info(tmp_path, capsys):
    model = tiny_bit()
    model.class_names = list("abcde")
    path = tmp_path / "bit.safetensors"
    vitlab.save(model, path)
    back = vitlab.load(path)
    assert isinstance(back, BiTResNet) and back.config == model.config and back.class_names == list("abcde")
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(logits(model, x, float64=False), logits(back, x, float64=False))
    assert main(["info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["params"] == sum(p.numel() for p in model.parameters())
    assert info["config"]["layers"] == [2, 2, 2, 2] and info["format"] == "vitlab"
    fresh = vitlab.load(path, num_classes=3)  # transfer: a fresh zero head
    assert fresh.config.num_classes == 3 and fresh.head.weight.abs().max() == 0


def test_vit_checkpoint_without_a_kind_still_loads(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    vit = perturb(vitlab.create_model("ViT-C/4", depth=1))
    path = tmp_path / "vit.safetensors"
    vitlab.save(vit, path)
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
    assert meta.pop("config_kind") == "vit"
    save_file(load_file(str(path)), str(path), metadata=meta)  # as written before BiT existed
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(logits(vitlab.load(path), x), logits(vit, x))


# Weights: the official .npz -----------------------------------------------------------------
def test_npz_round_trip_is_bit_exact_and_detected(tmp_path):
    model = tiny_bit(stem="bit", image_size=64)
    first, second = tmp_path / "a.npz", tmp_path / "b.npz"
    vitlab.save(model, first, format="npz")
    assert detect_format(first)[0] == "npz"
    back = vitlab.load(first)
    # The format stores no image size (224 is assumed) and no head initialisation.
    assert back.config.replace(image_size=64) == model.config.replace(name=back.config.name, head_init="zeros")
    ours, theirs = model.state_dict(), back.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    vitlab.save(back, second, format="npz")
    with np.load(first) as a, np.load(second) as b:
        assert sorted(a.files) == sorted(b.files)
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
        assert a["resnet/head/conv2d/kernel"].shape == (1, 1, 1024, 5)
        assert a["resnet/block2/unit01/a/proj/standardized_conv2d/kernel"].shape == (1, 1, 128, 256)


def test_npz_read_by_timms_own_official_reader(tmp_path):
    """timm's `load_pretrained` reads the official BiT layout by itself: the archive vitlab
    writes must give, in timm, the logits vitlab gives."""
    pytest.importorskip("timm")
    from vitlab.checkpoints.timm import create_timm_model

    model = perturb(vitlab.create_model("BiT-R26x1", num_classes=10, base_width=32))
    path = tmp_path / "bit.npz"
    vitlab.save(model, path, format="npz")
    theirs = create_timm_model(model.config).eval()
    theirs.load_pretrained(str(path))
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(logits(theirs, x), logits(model, x), rtol=0, atol=1e-10)


def test_npz_refuses_what_it_cannot_hold(tmp_path):
    with pytest.raises(CheckpointError, match="stem='cifar'"):
        vitlab.save(tiny_bit(), tmp_path / "x.npz", format="npz")
    with pytest.raises(CheckpointError, match="allow_numerics_change"):
        vitlab.save(tiny_bit(stem="bit", ws_eps=1e-8), tmp_path / "x.npz", format="npz")
    assert not (tmp_path / "x.npz").exists()


def test_npz_with_a_missing_array_names_it(tmp_path):
    path = tmp_path / "a.npz"
    vitlab.save(tiny_bit(stem="bit"), path, format="npz")
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files if k != "resnet/block3/unit02/b/group_norm/beta"}
    np.savez(tmp_path / "cut.npz", **arrays)
    with pytest.raises(CheckpointError, match="block3/unit02/b/group_norm/beta"):
        vitlab.load(tmp_path / "cut.npz")


# Weights: timm --------------------------------------------------------------------------------
@pytest.fixture
def timm_r50():
    timm = pytest.importorskip("timm")
    return perturb(timm.create_model("resnetv2_50x1_bit", num_classes=10))


def test_timm_state_dict_gives_timms_logits(tmp_path, timm_r50):
    path = tmp_path / "resnetv2_50x1_bit.pth"
    torch.save(timm_r50.state_dict(), path)  # what a timm user has: a plain state dict
    assert detect_format(path)[0] == "timm"
    ours = vitlab.load(path)
    assert ours.config.name == "BiT-R50x1" and (ours.config.ws_eps, ours.config.gn_eps) == (1e-8, 1e-5)
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(logits(ours, x), logits(timm_r50, x), rtol=0, atol=1e-5)
    # fp32 as well, on small inputs: the same kernels in the same order.
    torch.testing.assert_close(logits(ours, x, float64=False), logits(timm_r50, x, float64=False), rtol=0, atol=1e-5)


def test_export_to_timm_round_trips_and_loads_in_timm(tmp_path, timm_r50):
    path = tmp_path / "theirs.pth"
    torch.save(timm_r50.state_dict(), path)
    ours = vitlab.load(path)
    out = tmp_path / "back.safetensors"
    vitlab.save(ours, out, format="timm")
    from safetensors.torch import load_file

    exported = load_file(str(out))
    original = timm_r50.state_dict()
    assert sorted(exported) == sorted(original)
    assert all(torch.equal(exported[k], original[k]) for k in original)


def test_timm_refuses_and_foreign_resnets_are_named(tmp_path):
    timm = pytest.importorskip("timm")
    with pytest.raises(CheckpointError, match="stem='cifar'"):
        vitlab.save(tiny_bit(), tmp_path / "x.pth", format="timm")
    with pytest.raises(CheckpointError, match="allow_numerics_change"):
        vitlab.save(tiny_bit(stem="bit"), tmp_path / "x.pth", format="timm")  # official eps 1e-10, timm's 1e-8
    # A BatchNorm ResNetV2 has running statistics a BiT ResNet has no place for.
    with torch.device("meta"):
        bn = timm.create_model("resnetv2_50")
    state = {k: torch.zeros(v.shape) for k, v in bn.state_dict().items()}
    torch.save(state, tmp_path / "bn.pth")
    with pytest.raises(CheckpointError, match="running_mean"):
        vitlab.load(tmp_path / "bn.pth")


@pytest.mark.parametrize("target", ["hf", "torchvision"])
def test_formats_without_a_resnet_refuse_one_by_name(tmp_path, capsys, target):
    """Hugging Face's ViT folders and torchvision's ViT state dicts have no form of a BiT
    ResNet: saving or converting one is refused in one line, naming the formats that hold it."""
    with pytest.raises(CheckpointError, match=rf"{target} format holds ViT models only"):
        vitlab.save(tiny_bit(), tmp_path / "x", format=target)
    vitlab.save(tiny_bit(), tmp_path / "bit.safetensors")
    dst = tmp_path / ("hf" if target == "hf" else "tv.pth")
    assert main(["convert", str(tmp_path / "bit.safetensors"), str(dst), "--to", target]) == 2
    err = capsys.readouterr().err
    assert "write it as vitlab, npz, timm" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bit.safetensors"]
