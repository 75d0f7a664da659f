"""`vitlab.transform`: the preprocessing a model expects, matched against timm's
`create_transform(**resolve_data_config(model=...))` and transformers' image processors for
the same weights, on real photos (scikit-learn's and matplotlib's sample images: non-square,
so a squash and a centre crop differ)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

import vitlab
from hub_standin import GOOGLE, TIMM, hf_repo_files, timm_repo_files
from vitlab.checkpoints import hub, pretrained
from vitlab.checkpoints.timm import create_timm_model


def photos() -> list[Image.Image]:
    import matplotlib
    import sklearn.datasets

    files = [Path(sklearn.datasets.__file__).parent / "images" / n for n in ("china.jpg", "flower.jpg")]
    files.append(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg")
    return [Image.open(f).convert("RGB") for f in files]


def timm_transform(model):
    from timm.data import create_transform, resolve_data_config

    return create_transform(**resolve_data_config(model=model))


def test_matches_timm_for_the_same_weights(hub_cache):
    import timm

    files, _ = timm_repo_files()
    hub_cache.add("timm/" + TIMM, files)
    ours = vitlab.transform(vitlab.load("timm:" + TIMM))
    theirs = timm_transform(timm.create_model("hf-hub:timm/" + TIMM, pretrained=True))
    for image in photos():
        a, b = ours(image), theirs(image)
        assert a.shape == b.shape == (3, 224, 224) and (a - b).abs().max() <= 1e-6


def test_matches_transformers_processors_for_the_same_weights(hub_cache, tmp_path):
    """An imported Hugging Face checkpoint records transformers 5.x's backend (a uint8 tensor
    resized by torchvision): the processor AutoImageProcessor gives, for a PIL image and for a
    tensor alike. The PIL processor differs (by a grey level here and there), so the check can fail."""
    from torchvision.transforms.functional import pil_to_tensor
    from transformers import AutoImageProcessor, ViTImageProcessorPil

    files, _ = hf_repo_files(tmp_path)
    hub_cache.add(GOOGLE, files)
    model = vitlab.load("hf-hub:" + GOOGLE)
    assert model.config.resize_backend == "tensor"
    ours = vitlab.transform(model)
    cache = str(hub_cache.root)
    default = AutoImageProcessor.from_pretrained(GOOGLE, cache_dir=cache, local_files_only=True)  # torchvision kernels
    pil = ViTImageProcessorPil.from_pretrained(GOOGLE, cache_dir=cache, local_files_only=True)
    as_pil = vitlab.transform(model.config.replace(resize_backend="pil"))
    differ = 0.0
    for image in photos():
        from_tensor = default(image, return_tensors="pt")["pixel_values"][0]
        assert (ours(image) - from_tensor).abs().max() <= 1e-6
        assert (ours(pil_to_tensor(image)) - from_tensor).abs().max() <= 1e-6  # the input's type does not matter
        from_pil = pil(image, return_tensors="pt")["pixel_values"][0]
        assert (as_pil(image) - from_pil).abs().max() <= 1e-6 and (as_pil(pil_to_tensor(image)) - from_pil).abs().max() <= 1e-6
        differ = max(differ, float((from_pil - from_tensor).abs().max()))
    assert differ > 1e-3  # the two backends are not the same pixels


def test_the_transform_prints_what_it_does():
    cfg = vitlab.get_config("ViT-Ti/16", depth=1, crop_fraction=0.9, crop_mode="center", interpolation="bicubic",
                            mean=(0.4, 0.45, 0.5))
    text = repr(vitlab.transform(cfg))
    for part in ("224x224", "shorter side to 248", "bicubic", "by PIL", "centre 224x224 (crop_fraction 0.9)",
                 "mean (0.4, 0.45, 0.5)", "std (0.5, 0.5, 0.5)"):
        assert part in text, (part, text)
    assert "backend 'tensor'" in repr(vitlab.transform(cfg.replace(resize_backend="tensor")))
    assert "object at 0x" not in repr(vitlab.transform(cfg, train=True))


@pytest.mark.parametrize("crop", [(0.875, "center", "bicubic"), (0.9, "squash", "bilinear"), (1.0, "center", "bicubic")])
def test_a_converted_timm_model_carries_its_preprocessing(crop):
    fraction, mode, interpolation = crop
    cfg = vitlab.get_config("ViT-Ti/16", depth=1, image_size=(224, 192), mean=(0.4, 0.45, 0.5), std=(0.2, 0.25, 0.3),
                            crop_fraction=fraction, crop_mode=mode, interpolation=interpolation)
    theirs = timm_transform(create_timm_model(cfg))
    ours = vitlab.transform(cfg)
    for image in photos():
        a, b = ours(image), theirs(image)
        assert a.shape == (3, 224, 192) and (a - b).abs().max() <= 1e-6


def test_registry_preprocessing_is_timms_for_the_same_weights():
    """The crop, resize and normalisation the registry gives each AugReg .npz are those of
    timm's pretrained_cfg for the same weights."""
    import timm

    checked = 0
    for entry in pretrained.PRETRAINED.values():
        if not entry.timm_name:
            continue
        pcfg = timm.models.get_pretrained_cfg(entry.timm_name)
        if pcfg is None:
            continue
        ours = hub.registry_preprocessing(entry)
        assert ours["crop_fraction"] == pcfg.crop_pct and ours["crop_mode"] == pcfg.crop_mode, entry.name
        assert ours["interpolation"] == pcfg.interpolation and tuple(ours["mean"]) == tuple(pcfg.mean), entry.name
        checked += 1
    assert checked >= 20


def test_training_transform_matches_the_eval_one_where_they_meet():
    """With the whole image as the crop and no flip, the inception crop is the eval resize:
    the same size, interpolation and normalisation."""
    cfg = vitlab.get_config("ViT-Ti/16", depth=1, interpolation="bicubic", mean=(0.3, 0.4, 0.5))
    whole = dict(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), hflip=False)
    image = photos()[0].crop((0, 0, 427, 427))
    pil = vitlab.transform(cfg, train=True, decode="pil", **whole)  # resized by PIL, as the evaluation is
    assert torch.allclose(pil(image), vitlab.transform(cfg)(image), atol=1e-6)
    fast = vitlab.transform(cfg, train=True, **whole)  # the fast path: torch's antialiased kernel on uint8
    assert (fast(image) - vitlab.transform(cfg)(image)).abs().mean() * 255 * min(cfg.std) < 1.0  # under a grey level
    with pytest.raises(TypeError, match="train=True"):
        vitlab.transform(cfg, randaugment=2)


@pytest.mark.parametrize("name,weights", [("ViT-B/16", "ViT_B_16_Weights"), ("ViT-L/16", "ViT_L_16_Weights")])
def test_a_torchvision_state_dict_gets_its_weights_preset(name, weights, tmp_path):
    """torchvision's own weights evaluate with weights.transforms() (the shorter side to 256, or
    242 for ViT-L/16, bilinear, by PIL, a centre crop of 224): a state dict of that shape reads
    with the same preprocessing, to 1e-6 on real photos."""
    import torchvision.models as tvm

    from vitlab.checkpoints.torchvision import weights_preset

    cfg = vitlab.get_config(name, depth=1, gelu="exact", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    preset = getattr(tvm, weights).IMAGENET1K_V1.transforms()
    ours = vitlab.transform(cfg.replace(**weights_preset(cfg)))
    assert ours.resize_size == (preset.resize_size[0],) * 2 and ours.crops
    for image in photos():
        assert (ours(image) - preset(image)).abs().max() <= 1e-6
    if name == "ViT-B/16":  # read from a file: the config carries it
        from vitlab.checkpoints.torchvision import create_torchvision_model

        torch.save(create_torchvision_model(cfg).state_dict(), tmp_path / "tv.pth")
        back = vitlab.load(tmp_path / "tv.pth").config
        assert (back.crop_fraction, back.crop_mode, back.interpolation) == (224 / 256, "center", "bilinear")
