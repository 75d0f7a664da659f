"""Hugging Face transformers <-> vitlab: the same weights give transformers' own logits."""

from __future__ import annotations

import json

import pytest
import torch

import vitlab
from conftest import perturb
from vitlab.checkpoints.io import CheckpointError

transformers = pytest.importorskip("transformers")


def hf_model(**kw):
    from transformers import ViTConfig, ViTForImageClassification

    cfg = dict(hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=768,
               image_size=64, patch_size=16, num_labels=5)
    cfg.update(kw)
    return perturb(ViTForImageClassification(ViTConfig(**cfg)))


@pytest.mark.parametrize("act,eps", [("gelu", 1e-12), ("gelu_pytorch_tanh", 1e-6)])
def test_hf_to_vitlab(tmp_path, act, eps):
    theirs = hf_model(hidden_act=act, layer_norm_eps=eps, id2label={i: f"class {i}" for i in range(5)})
    theirs.save_pretrained(tmp_path / "hf")
    ours = vitlab.load(tmp_path / "hf")
    assert ours.config.layer_norm_eps == eps
    assert ours.config.gelu == ("exact" if act == "gelu" else "tanh")
    assert ours.class_names == [f"class {i}" for i in range(5)]
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want, got = theirs(pixel_values=x).logits, ours(x)
    assert want.abs().max() > 0.3
    assert (got - want).abs().max() < 1e-5
    # and back: the same tensors as save_pretrained wrote
    vitlab.save(ours, tmp_path / "back", format="hf")
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_vitlab_to_hf(tmp_path):
    from transformers import ViTForImageClassification

    ours = perturb(vitlab.create_model("ViT-S/16", depth=2, image_size=64, num_classes=4, gelu="tanh", qkv_bias=False))
    ours.class_names = ["cat", "dog", "bird", "fish"]
    vitlab.save(ours, tmp_path / "hf", format="hf")
    theirs = ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    assert theirs.config.id2label[2] == "bird" and theirs.config.hidden_act == "gelu_pytorch_tanh"
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want, got = theirs(pixel_values=x).logits, ours(x)
    assert want.abs().max() > 0.3
    assert (got - want).abs().max() < 1e-5
    back = vitlab.load(tmp_path / "hf")
    a, b = ours.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert back.class_names == ours.class_names and back.config.gelu == "tanh" and not back.config.qkv_bias


def test_headless_vitmodel_pooler_is_the_pre_logits_layer(tmp_path):
    from transformers import ViTConfig, ViTModel

    theirs = perturb(ViTModel(ViTConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=128, image_size=32, patch_size=8)))
    theirs.save_pretrained(tmp_path / "in21k")
    ours = vitlab.load(tmp_path / "in21k")
    assert ours.config.num_classes == 0 and ours.config.representation_size == 64
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = theirs(pixel_values=x)
        assert (ours(x) - out.pooler_output).abs().max() < 1e-5
        assert (ours.forward_features(x) - out.last_hidden_state).abs().max() < 1e-5
    vitlab.save(ours, tmp_path / "again", format="hf")
    again = ViTModel.from_pretrained(tmp_path / "again").eval()
    with torch.no_grad():
        assert torch.equal(again(pixel_values=x).pooler_output, out.pooler_output)


def test_refusals_name_the_feature(tmp_path):
    for overrides, feature in (
        (dict(classifier="gap"), "gap"),
        (dict(pos_embed="learned_2d"), "learned_2d"),
        (dict(pos_embed="relative"), "relative"),
        (dict(representation_size=16, num_classes=3), "representation_size=16"),
    ):
        m = vitlab.create_model("ViT-Ti/16", depth=1, image_size=32, **overrides)
        with pytest.raises(CheckpointError, match=feature):
            vitlab.save(m, tmp_path / "x", format="hf")
        assert not (tmp_path / "x").exists()
    m = vitlab.create_model("R50+ViT-B/16", depth=1, image_size=32, resnet={"layers": (1,)})
    with pytest.raises(CheckpointError, match="hybrid"):
        vitlab.save(m, tmp_path / "x", format="hf")


def test_unknown_activation_is_refused(tmp_path):
    theirs = hf_model(num_hidden_layers=1)
    theirs.save_pretrained(tmp_path / "hf")
    c = json.loads((tmp_path / "hf" / "config.json").read_text())
    c["hidden_act"] = "relu"
    (tmp_path / "hf" / "config.json").write_text(json.dumps(c))
    with pytest.raises(CheckpointError, match="hidden_act='relu'"):
        vitlab.load(tmp_path / "hf")
