"""torchvision <-> vitlab: the same weights give torchvision's own logits."""

from __future__ import annotations

import pytest
import torch

import vitlab
from conftest import perturb
from vitlab.checkpoints.io import CheckpointError
from vitlab.checkpoints.torchvision import create_torchvision_model


@pytest.mark.parametrize("representation", [None, 96])
def test_torchvision_to_vitlab_and_back(tmp_path, representation):
    cfg = vitlab.get_config("ViT-S/16", depth=2, image_size=64, num_classes=10, gelu="exact",
                            representation_size=representation)
    theirs = perturb(create_torchvision_model(cfg))
    torch.save(theirs.state_dict(), tmp_path / "tv.pth")
    ours = vitlab.load(tmp_path / "tv.pth")
    assert ours.config.representation_size == representation and ours.config.num_heads == 6
    assert ours.config.mean == (0.485, 0.456, 0.406)  # torchvision's own weights use ImageNet statistics
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want, got = theirs(x), ours(x)
    assert want.abs().max() > 0.3
    assert (got - want).abs().max() < 1e-5
    vitlab.save(ours, tmp_path / "back.pth", format="torchvision")
    a, b = theirs.state_dict(), torch.load(tmp_path / "back.pth", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_vitlab_to_torchvision(tmp_path):
    ours = perturb(vitlab.create_model("ViT-S/16", depth=2, image_size=64, num_classes=10, gelu="exact",
                                       layer_norm_eps=1e-5), seed=1)
    # a .pth holds no config: torchvision's LayerNorm default (1e-6) is what a reader assumes
    with pytest.raises(CheckpointError, match="layer_norm_eps=1e-05 reads back as 1e-06"):
        vitlab.save(ours, tmp_path / "tv.pth", format="torchvision")
    with pytest.warns(UserWarning, match="will differ: layer_norm_eps"):
        vitlab.save(ours, tmp_path / "tv.pth", format="torchvision", allow_numerics_change=True)
    theirs = create_torchvision_model(ours.config).eval()
    theirs.load_state_dict(torch.load(tmp_path / "tv.pth", weights_only=True), strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (ours(x) - theirs(x)).abs().max() < 1e-5
    # a .safetensors copy carries the config: the round trip is exact, config included
    vitlab.save(ours, tmp_path / "tv.safetensors", format="torchvision")
    back = vitlab.load(tmp_path / "tv.safetensors")
    assert back.config == ours.config
    a, b = ours.state_dict(), back.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_old_mlp_names_are_read(tmp_path):
    cfg = vitlab.get_config("ViT-Ti/16", depth=1, image_size=32, num_classes=3, gelu="exact")
    theirs = perturb(create_torchvision_model(cfg))
    old = {k.replace("mlp.0.", "mlp.linear_1.").replace("mlp.3.", "mlp.linear_2."): v for k, v in theirs.state_dict().items()}
    torch.save(old, tmp_path / "old.pth")
    ours = vitlab.load(tmp_path / "old.pth")
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert (ours(x) - theirs(x)).abs().max() < 1e-5


def test_refusals_name_the_feature(tmp_path):
    for overrides, feature in (
        (dict(classifier="gap"), "gap"),
        (dict(gelu="tanh"), "gelu='tanh'"),
        (dict(num_classes=0), "num_classes=0"),
        (dict(qkv_bias=False), "qkv_bias"),
    ):
        m = vitlab.create_model("ViT-Ti/16", depth=1, image_size=32, **{"gelu": "exact", **overrides})
        with pytest.raises(CheckpointError, match=feature):
            vitlab.save(m, tmp_path / "x.pth", format="torchvision")
    assert not (tmp_path / "x.pth").exists()
