"""The BiT ResNet (models/bit.py): counts against timm's models, the model contract, FLOPs.
The parameter counts of every variant are pinned in test_models_vit.py; the weights in every
format are tested in test_checkpoints_bit.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import vitlab
from conftest import perturb, tiny_bit
from vitlab.config import BiTConfig, ConfigError, model_flops
from vitlab.models.resnet import StdConv2d

TIMM_NAMES = {
    "BiT-R50x1": "resnetv2_50x1_bit",
    "BiT-R101x1": "resnetv2_101x1_bit",
    "BiT-R50x3": "resnetv2_50x3_bit",
    "BiT-R101x3": "resnetv2_101x3_bit",
    "BiT-R152x2": "resnetv2_152x2_bit",
    "BiT-R152x4": "resnetv2_152x4_bit",
}


# The architecture -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(TIMM_NAMES))
def test_counts_match_timm_bit_models(name):
    timm = pytest.importorskip("timm")
    with torch.device("meta"):
        ours = vitlab.create_model(name)
        theirs = timm.create_model(TIMM_NAMES[name])
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


# Table 6's ResNets that timm registers under no name: timm's own ResNetV2 builder with the
# same stages and width factor (BiT's R200 has 3, 24, 36, 3 units).
TABLE6_BIT = {"BiT-R50x2": ((3, 4, 6, 3), 2), "BiT-R152x1": ((3, 8, 36, 3), 1), "BiT-R200x3": ((3, 24, 36, 3), 3)}
# Table 6's hybrids: timm's hybrid builder on the same ResNet stages (stage 4 kept: /32; folded into stage 3: /16).
TABLE6_HYBRIDS = {"R50x1+ViT-B/32": ((3, 4, 6, 3), 768, 12, 12), "R50x1+ViT-L/16": ((3, 4, 9), 1024, 24, 16)}


@pytest.mark.parametrize("name", list(TABLE6_BIT))
def test_table6_resnets_match_timm_resnetv2(name):
    pytest.importorskip("timm")
    from timm.models import resnetv2

    layers, width = TABLE6_BIT[name]
    with torch.device("meta"):
        ours = vitlab.create_model(name)
        theirs = resnetv2._create_resnetv2_bit("resnetv2_50x1_bit", layers=list(layers), width_factor=width)
    assert ours.config.layers == layers and ours.config.width_factor == width
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


@pytest.mark.parametrize("name", list(TABLE6_HYBRIDS))
def test_table6_hybrids_match_timm_hybrids(name):
    pytest.importorskip("timm")
    from timm.models import vision_transformer_hybrid as hybrid

    layers, width, depth, heads = TABLE6_HYBRIDS[name]
    with torch.device("meta"):
        ours = vitlab.create_model(name, num_classes=1000)
        backbone = hybrid._resnetv2(layers=layers)
        theirs = hybrid._create_vision_transformer_hybrid("vit_base_r50_s16_224", backbone=backbone, embed_dim=width,
                                                          depth=depth, num_heads=heads, num_classes=1000)
    assert ours.config.name == name.replace("R50x1+", "R50+")  # Table 6's spelling names the registered variant
    assert ours.config.resnet.layers == layers and ours.config.total_stride == int(name.split("/")[-1])
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
    model = tiny_bit(stem=stem).train()
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
    model = tiny_bit()
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
        tiny_bit()(torch.randn(1, 1, 32, 32))


def test_any_image_size_runs():
    model = tiny_bit()
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
    model = tiny_bit(**overrides)
    x = torch.randn(1, 3, *model.config.image_size)
    assert model_flops(model.config) == _counted_flops(model, x)


def test_r50_flops_at_224():
    # 4.09 GMACs: the figure published for ResNet-50-sized BiT models.
    assert model_flops(vitlab.get_config("BiT-R50x1")) / 2e9 == pytest.approx(4.09, abs=0.01)
