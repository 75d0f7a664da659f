"""The BiT ResNet (models/bit.py): counts, the model contract, FLOPs, and its weights in every
format (vitlab's own, the official .npz, timm's resnetv2_*_bit) against timm's own forward.

Parameters are perturbed away from their initial values (norm weights off 1, biases off 0)
so that a dropped or misplaced tensor shows in the logits. The parameter counts of every
variant are pinned in test_model.py; here they are also checked against timm's models.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import vitlab
from vitlab.checkpoints import detect_format
from vitlab.checkpoints.io import CheckpointError
from vitlab.cli import main
from vitlab.config import BiTConfig, ConfigError, model_flops
from vitlab.models.bit import BiTResNet
from vitlab.models.resnet import StdConv2d

from conftest import logits, perturb

TIMM_NAMES = {
    "BiT-R50x1": "resnetv2_50x1_bit",
    "BiT-R101x1": "resnetv2_101x1_bit",
    "BiT-R50x3": "resnetv2_50x3_bit",
    "BiT-R101x3": "resnetv2_101x3_bit",
    "BiT-R152x2": "resnetv2_152x2_bit",
    "BiT-R152x4": "resnetv2_152x4_bit",
}


def small(**overrides) -> BiTResNet:
    """An R26 at half width, 32 px: every kind of unit, little CPU."""
    base = dict(num_classes=5, head_init="xavier")
    base.update(overrides)
    return perturb(vitlab.create_model("BiT-R26-C", **base))


# The architecture -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(TIMM_NAMES))
def test_counts_match_timm_bit_models(name):
    timm = pytest.importorskip("timm")
    with torch.device("meta"):
        ours = vitlab.create_model(name)
        theirs = timm.create_model(TIMM_NAMES[name])
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


def test_registered_names_and_the_api():
    names = vitlab.list_models()
    for name in [*TIMM_NAMES, "BiT-R26x1", "BiT-R26-C"]:
        assert name in names
    assert vitlab.create_model("bit-r50x1", num_classes=3).config.name == "BiT-R50x1"
    assert isinstance(vitlab.get_config("BiT-R152x4"), BiTConfig)
    assert vitlab.get_config("BiT-R101x3").depth == 101


@pytest.mark.parametrize("stem", ["bit", "cifar"])
def test_contract_forward_intermediates_head_and_gradients(stem):
    torch.manual_seed(0)
    model = small(stem=stem).train()
    cfg = model.config
    x = torch.randn(2, 3, 32, 32)
    out = model(x, return_intermediates=True)
    assert out["logits"].shape == (2, 5)
    assert out["pre_logits"].shape == (2, cfg.feature_dim) == (2, 1024)
    assert [s.shape[1] for s in out["stages"]] == [4 * w for w in cfg.stage_widths]
    assert out["stages"][-1].shape[-1] == 32 // cfg.stride
    assert out["stem"].shape[-1] == (8 if stem == "bit" else 32)
    # forward, forward_features + forward_head and the intermediates are one function.
    torch.testing.assert_close(model(x), out["logits"], rtol=0, atol=0)
    feats = model.forward_features(x)
    torch.testing.assert_close(model.forward_head(feats, pre_logits=True), out["pre_logits"], rtol=0, atol=0)
    out["logits"].square().sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_reset_classifier_and_no_head():
    model = small()
    model.reset_classifier(7)
    assert model.config.num_classes == 7 and model.config.head_init == "xavier"
    assert torch.count_nonzero(model.head.weight) > 0
    model.reset_classifier(3, init="zeros")
    assert model(torch.randn(1, 3, 32, 32)).abs().max() == 0  # a zero head, as BiT transfers
    model.reset_classifier(0)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, model.config.feature_dim)
    assert (model.config.mean, model.config.std, model.config.in_channels) == ((0.5,) * 3, (0.5,) * 3, 3)
    assert model.class_names is None


def test_weight_standardisation_is_the_official_formula():
    conv = perturb(StdConv2d(8, 16, 3, eps=1e-10, mode="var", same=False))
    w = conv.weight.double()
    mean = w.mean(dim=(1, 2, 3), keepdim=True)
    var = ((w - mean) ** 2).mean(dim=(1, 2, 3), keepdim=True)
    torch.testing.assert_close(conv.double().standardized_weight(), (w - mean) / torch.sqrt(var + 1e-10))


def test_bad_configs_and_inputs_name_the_fix():
    with pytest.raises(ConfigError, match="gn_groups"):
        BiTConfig(base_width=48)
    with pytest.raises(ConfigError, match="stem"):
        BiTConfig(stem="deep")
    with pytest.raises(ConfigError, match="unknown key"):
        vitlab.create_model("BiT-R50x1", patch_size=16)
    with pytest.raises(ValueError, match="input channels"):
        small()(torch.randn(1, 1, 32, 32))


def test_any_image_size_runs():
    model = small()
    assert model(torch.randn(1, 3, 48, 40)).shape == (1, 5)


def _counted_flops(model: nn.Module, x: torch.Tensor) -> int:
    """2 x multiply-accumulates of every convolution and linear layer, counted from the
    shapes the forward actually produces."""
    total = []

    def conv_hook(m, inp, out):
        total.append(2 * out[0].numel() * m.in_channels * m.kernel_size[0] * m.kernel_size[1])

    def linear_hook(m, inp, out):
        total.append(2 * out[0].numel() * m.in_features)

    hooks = [m.register_forward_hook(conv_hook) for m in model.modules() if isinstance(m, nn.Conv2d)]
    hooks += [m.register_forward_hook(linear_hook) for m in model.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return sum(total)


@pytest.mark.parametrize("overrides", [dict(), dict(stem="bit", image_size=64), dict(num_classes=0, image_size=40)])
def test_flops_are_what_the_forward_computes(overrides):
    model = small(**overrides)
    x = torch.randn(1, 3, *model.config.image_size)
    assert model_flops(model.config) == _counted_flops(model, x)


def test_r50_flops_at_224():
    # 4.09 GMACs: the figure published for ResNet-50-sized BiT models.
    assert model_flops(vitlab.get_config("BiT-R50x1")) / 2e9 == pytest.approx(4.09, abs=0.01)


# Weights: vitlab's own format ---------------------------------------------------------------
def test_vitlab_checkpoint_round_trip_and_info(tmp_path, capsys):
    model = small()
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
    model = small(stem="bit", image_size=64)
    first, second = tmp_path / "a.npz", tmp_path / "b.npz"
    vitlab.save(model, first, format="npz")
    assert detect_format(first) == "npz"
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
        vitlab.save(small(), tmp_path / "x.npz", format="npz")
    with pytest.raises(CheckpointError, match="allow_numerics_change"):
        vitlab.save(small(stem="bit", ws_eps=1e-8), tmp_path / "x.npz", format="npz")
    assert not (tmp_path / "x.npz").exists()


def test_npz_with_a_missing_array_names_it(tmp_path):
    path = tmp_path / "a.npz"
    vitlab.save(small(stem="bit"), path, format="npz")
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
    assert detect_format(path) == "timm"
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
        vitlab.save(small(), tmp_path / "x.pth", format="timm")
    with pytest.raises(CheckpointError, match="allow_numerics_change"):
        vitlab.save(small(stem="bit"), tmp_path / "x.pth", format="timm")  # official eps 1e-10, timm's 1e-8
    # A BatchNorm ResNetV2 has running statistics a BiT ResNet has no place for.
    with torch.device("meta"):
        bn = timm.create_model("resnetv2_50")
    state = {k: torch.zeros(v.shape) for k, v in bn.state_dict().items()}
    torch.save(state, tmp_path / "bn.pth")
    with pytest.raises(CheckpointError, match="running_mean"):
        vitlab.load(tmp_path / "bn.pth")
