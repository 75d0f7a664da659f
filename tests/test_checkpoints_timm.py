"""timm <-> vitlab: the same weights give the logits timm's own forward gives.

Widths and patch sizes are the real ones (ViT-S/16, ViT-B/32 at 384 px); depth is cut to 2
blocks to keep CPU time small — every block is the same code, so more of them test nothing
new. Parameters are perturbed away from their initial values (norm weights off 1, biases
off 0) so that a dropped or misplaced tensor shows in the logits.
"""

from __future__ import annotations

import pytest
import torch

import vitlab
from conftest import logits, perturb
from vitlab.checkpoints.io import CheckpointError

timm = pytest.importorskip("timm")

from vitlab.checkpoints.timm import create_timm_model  # noqa: E402

HYBRID = dict(layers=(1, 1), ws_mode="var", ws_eps=1e-8, gn_eps=1e-5)  # timm's numerics
CASES = {
    "ViT-S/16": ("ViT-S/16", dict(depth=2, gelu="exact", num_classes=10)),
    "ViT-B/32@384": ("ViT-B/32", dict(depth=2, gelu="exact", num_classes=10, image_size=384)),
    "GAP": ("ViT-S/16", dict(depth=2, gelu="exact", classifier="gap", num_classes=10, image_size=96)),
    # The hybrid's transformer is narrowed to 192 wide (3 heads): the stem is what is tested.
    "R+ViT hybrid": ("R50+ViT-B/16", dict(depth=2, hidden_size=192, num_heads=3, mlp_dim=768, gelu="exact",
                                          image_size=64, num_classes=10, resnet=HYBRID)),
}


SLOW = {"ViT-B/32@384", "R+ViT hybrid"}
PARAMS = [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES]


@pytest.mark.parametrize("case", PARAMS)
def test_timm_to_vitlab(tmp_path, case):
    name, overrides = CASES[case]
    cfg = vitlab.get_config(name, **overrides)
    theirs = perturb(create_timm_model(cfg))
    path = tmp_path / "timm.pth"
    torch.save(theirs.state_dict(), path)  # what a timm user has: a plain state dict
    ours = vitlab.load(path)
    assert ours.config.gelu == "exact" and ours.config.resize_mode == "bicubic"
    assert ours.config.classifier == cfg.classifier and ours.config.image_size == cfg.image_size
    if cfg.resnet:
        assert (ours.config.resnet.ws_mode, ours.config.resnet.ws_eps, ours.config.resnet.gn_eps) == ("var", 1e-8, 1e-5)
    x = torch.randn(2, 3, *cfg.image_size)
    want = logits(theirs, x)
    assert want.abs().max() > 0.3
    assert (logits(ours, x) - want).abs().max() < 1e-5
    # ... and back: the same state dict, bit for bit
    vitlab.save(ours, tmp_path / "back.safetensors", format="timm")
    from safetensors.torch import load_file

    back, orig = load_file(tmp_path / "back.safetensors"), theirs.state_dict()
    assert back.keys() == orig.keys()
    assert all(torch.equal(back[k], orig[k]) for k in orig)


@pytest.mark.parametrize("case", PARAMS)
def test_vitlab_to_timm(tmp_path, case):
    name, overrides = CASES[case]
    ours = perturb(vitlab.create_model(name, **overrides), seed=1)
    path = tmp_path / "for_timm.safetensors"
    vitlab.save(ours, path, format="timm")
    from safetensors.torch import load_file

    theirs = create_timm_model(ours.config).eval()
    theirs.load_state_dict(load_file(path), strict=True)
    x = torch.randn(2, 3, *ours.config.image_size)
    want = logits(theirs, x)
    assert want.abs().max() > 0.3
    assert (logits(ours, x) - want).abs().max() < 1e-5
    # vitlab -> timm -> vitlab is bit-exact (the config travels in the file's metadata)
    back = vitlab.load(path)
    assert back.config == ours.config
    a, b = ours.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_registered_timm_model_reads_without_help(tmp_path):
    """A state dict of timm's own registered architecture, heads guessed from the width."""
    theirs = perturb(timm.create_model("vit_small_patch16_224", pretrained=False, depth=1, num_classes=3))
    path = tmp_path / "vit_small.safetensors"
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, path)
    ours = vitlab.load(path)
    assert (ours.config.num_heads, ours.config.hidden_size, ours.config.patch_size) == (6, 384, 16)
    x = torch.randn(1, 3, 224, 224)
    assert (logits(ours, x) - logits(theirs, x)).abs().max() < 1e-5


def test_refusals_name_the_feature(tmp_path):
    m = vitlab.create_model("ViT-Ti/16", depth=1, image_size=32, representation_size=16)
    with pytest.raises(CheckpointError, match="representation_size=16"):
        vitlab.save(m, tmp_path / "x.safetensors", format="timm")
    m = vitlab.create_model("ViT-Ti/16", depth=1, image_size=32, pos_embed="sincos_2d")
    with pytest.raises(CheckpointError, match="sincos_2d"):
        vitlab.save(m, tmp_path / "x.safetensors", format="timm")
    m = vitlab.create_model("R50+ViT-B/16", depth=1, image_size=32, resnet={"layers": (1,)})  # official ws
    with pytest.raises(CheckpointError, match="ws_mode='std'"):
        vitlab.save(m, tmp_path / "x.safetensors", format="timm")
    assert not (tmp_path / "x.safetensors").exists()
    gap = timm.create_model("vit_small_patch16_224", pretrained=False, depth=1, num_classes=3,
                            class_token=False, global_pool="avg")  # fc_norm: LN after pooling
    torch.save(gap.state_dict(), tmp_path / "fc_norm.pth")
    with pytest.raises(CheckpointError, match="fc_norm"):
        vitlab.load(tmp_path / "fc_norm.pth")


def test_a_one_channel_vit_reads_back_from_a_timm_state_dict(tmp_path):
    """A state dict names no preprocessing, so the reader builds the config with one mean/std
    value per input channel of the patch embedding (it failed on a grey-scale model: 'mean/std
    need one value per input channel (1), got 3 and 3')."""
    model = vitlab.create_model("ViT-Ti/4", image_size=16, in_channels=1, mean=(0.5,), std=(0.5,), num_classes=10)
    vitlab.save(model, tmp_path / "grey.pth", format="timm", allow_numerics_change=True)
    back = vitlab.load(tmp_path / "grey.pth")
    assert back.config.in_channels == 1 and len(back.config.mean) == len(back.config.std) == 1
