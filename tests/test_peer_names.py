"""What a timm or Hugging Face user types on day one: their model names (checkpoints/peers.py), a
state dict saved without metadata (timm's own preprocessing for its architecture, each guessed
field marked), and "did you mean" for every closed set (vitlab/suggest.py). Checked against
timm and transformers themselves, on real photos."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
import torch
from PIL import Image

import vitlab
from conftest import SHARED_DATA
from test_data_transforms import photos
from vitlab.cli import main
from vitlab.config import ConfigError

# (timm name, the registered variant it is)
TIMM_NAMES = [
    ("vit_tiny_patch16_224", "ViT-Ti/16"), ("vit_tiny_patch16_384", "ViT-Ti/16"), ("vit_small_patch32_224", "ViT-S/32"),
    ("vit_base_patch16_224", "ViT-B/16"), ("vit_large_patch32_224", "ViT-L/32"),
    ("vit_base_patch16_224.augreg_in21k", "ViT-B/16"), ("vit_base_r50_s16_384", "R50+ViT-B/16"),
    ("vit_small_r26_s32_224.augreg_in21k_ft_in1k", "R26+ViT-S/32"),
]


def real_images() -> list[Image.Image]:
    """A CIFAR-10 test image of ../shared/data (and a non-square crop of it) and the photos."""
    shard = SHARED_DATA / "cifar10" / "test-000000.tar.gz"
    images = photos()
    if shard.is_file():
        with tarfile.open(shard) as tar:
            member = next(m for m in tar if m.name.endswith(".jpg"))
            image = Image.open(io.BytesIO(tar.extractfile(member).read())).convert("RGB")
        images += [image, image.crop((0, 4, 32, 28))]
    return images


@pytest.mark.parametrize("name,variant", TIMM_NAMES)
def test_timm_names_build_timms_model(name, variant):
    """The config of a timm name is timm's: sizes, head, and the pretrained_cfg preprocessing."""
    import timm

    cfg = vitlab.get_config(name)
    theirs = timm.create_model(name, pretrained=False)
    pcfg = theirs.pretrained_cfg
    assert cfg.name == variant and cfg.num_classes == theirs.num_classes
    assert list(cfg.image_size) == list(pcfg["input_size"][1:])
    assert (cfg.crop_fraction, cfg.interpolation, cfg.crop_mode) == (pcfg["crop_pct"], pcfg["interpolation"],
                                                                    pcfg["crop_mode"])
    assert cfg.mean == tuple(pcfg["mean"]) and cfg.std == tuple(pcfg["std"])
    assert sum(p.numel() for p in vitlab.create_model(name).parameters()) == sum(p.numel() for p in theirs.parameters())


def test_create_model_by_timm_name_computes_as_timm():
    """vitlab.create_model("vit_tiny_patch16_224") is ViT-Ti/16 with timm's numerics: the same
    weights in timm's model give the same logits (the default GELU or eps would not)."""
    import timm

    torch.manual_seed(0)
    ours = vitlab.create_model("vit_tiny_patch16_224").eval()
    for p in ours.parameters():
        p.data.normal_(0, 0.2)
    theirs = timm.create_model("vit_tiny_patch16_224").eval()
    theirs.load_state_dict(vitlab.checkpoints.timm.export_state(vitlab.checkpoints.timm.rules(ours.config),
                                                                ours.state_dict(), "ours"))
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert (ours(x) - theirs(x)).abs().max() < 1e-4


def test_hugging_face_names_are_architectures():
    from transformers import ViTConfig as HFConfig, ViTImageProcessor

    cfg = vitlab.get_config("google/vit-base-patch16-224")
    hf = HFConfig()
    assert cfg.name == "ViT-B/16" and cfg.layer_norm_eps == hf.layer_norm_eps and cfg.gelu == "exact"
    assert vitlab.get_config("google/vit-large-patch32-384").image_size == (384, 384)
    processor = ViTImageProcessor()  # the defaults a folder without preprocessor_config.json gets
    for image in real_images():
        theirs = processor(image, return_tensors="pt")["pixel_values"][0]
        assert (vitlab.transform(cfg)(image) - theirs).abs().max() <= 1e-5


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "vit_tiny_patch16_384"])
def test_bare_timm_file_gets_timms_preprocessing(tmp_path, name, capsys):
    """Must show: vitlab.transform(vitlab.load(bare_timm_file)) equals timm's create_transform(
    **resolve_data_config({}, model=...)) within 1e-5 on real images; no ImageNet names are
    assumed for a file whose name does not say ImageNet; `vitlab info` marks what it guessed."""
    import timm
    from timm.data import create_transform, resolve_data_config

    theirs = timm.create_model(name).eval()
    path = tmp_path / "my_vit.pth"
    torch.save(theirs.state_dict(), path)
    model = vitlab.load(path)
    ours, reference = vitlab.transform(model), create_transform(**resolve_data_config({}, model=theirs))
    for image in real_images():
        a, b = ours(image), reference(image)
        assert a.shape == b.shape and (a - b).abs().max() <= 1e-5
    assert model.class_names is None
    assert main(["info", str(path), "--json"]) == 0
    guessed = json.loads(capsys.readouterr().out)["guessed"]
    assert {"crop_fraction", "interpolation", "mean", "num_heads"} <= set(guessed) and "timm" in guessed["crop_fraction"]
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "crop_fraction" in out and "* not in the file: timm's pretrained_cfg default" in out
    named = tmp_path / "vit_in1k.pth"
    torch.save(theirs.state_dict(), named)
    assert vitlab.load(named).class_names[0] == "tench"  # the head and the name say ImageNet


def test_train_by_timm_name(tmp_path, capsys):
    """Must show: `vitlab train --model vit_tiny_patch16_224 --data digits` trains a ViT-Ti/16
    with timm's numerics at timm's resolution; it ends with the commands that come next."""
    out = tmp_path / "run"
    assert main(["train", "--model", "vit_tiny_patch16_224", "--data", "digits", "--steps", "1", "--batch-size", "4",
                 "--warmup-steps", "0", "--out", str(out), "--quiet", "data.eval_splits=[]"]) == 0
    cfg = vitlab.load(out / "checkpoints" / "last.safetensors").config
    assert (cfg.name, cfg.image_size, cfg.gelu, cfg.layer_norm_eps) == ("ViT-Ti/16", (224, 224), "exact", 1e-6)
    assert (cfg.crop_fraction, cfg.interpolation, cfg.num_classes) == (0.9, "bicubic", 10)
    printed = capsys.readouterr()
    assert f"next:\n  vitlab eval {out}/checkpoints/last.safetensors --data digits" in printed.out + printed.err


@pytest.mark.parametrize("argv,near", [
    (["train", "--model", "ViT-B/61"], "did you mean ViT-B/16"),
    (["train", "--config", "digits", "train.lrr=0.1"], "did you mean optim.lr?"),
    (["train", "--config", "digits", "optim.weight_decai=0.1"], "did you mean optim.weight_decay?"),
    (["train", "--config", "cifar1O"], "did you mean cifar10"),
    (["train", "--config", "digits", "model.nme=3"], "did you mean model.name?"),
    (["eval", "runs/x.safetensors", "--data", "digts"], None),
    (["predict", "x.safetensors", "y.png", "--precision", "int9"], "did you mean int8?"),
    (["convert", "a.npz", "b", "--to", "timn"], "did you mean timm?"),
    (["trian"], "did you mean train?"),
    (["train", "--config", "digits", "train.precision=bf61"], "did you mean bf16?"),
    (["train", "--config", "digits", "optim.decay=cosin"], "did you mean cosine?"),
    (["vtab", "runs/x.safetensors", "--root", "r", "--out", "o", "--tasks", "dtdd"], "did you mean dtd?"),
    (["train", "--img-size", "224"], "timm's --img-size is --image-size here"),
    (["train", "--stpes", "3"], "unrecognized arguments: --stpes; did you mean --steps? ("),
    (["train", "--batch_size", "8", "--stpes=3"], "--batch_size: did you mean --batch-size?; --stpes: did you mean --steps?"),
])
def test_did_you_mean(argv, near, capsys):
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    if near:
        assert near in err, err


def test_suggestions_name_the_near_one_and_list_each_choice_once():
    from vitlab import suggest
    from vitlab.data import DataError
    from vitlab.data.open import open_dataset

    with pytest.raises(DataError, match="did you mean digits"):
        open_dataset("digts", "train", lambda x: x)
    with pytest.raises(vitlab.checkpoints.CheckpointError, match="did you mean timm"):
        vitlab.checkpoints.format_module("tim")
    with pytest.raises(ConfigError) as e:
        vitlab.create_model("ViT-B/61")
    assert "ViT-L/16" not in str(e.value)  # the near one, not the whole list
    message = suggest.unknown("key", "model.zzzz", ["model.name", "model.depth", "model.name"])
    assert message.count("model.name") == 1
    with pytest.raises(ConfigError, match="tags ending in in1k or in21k"):
        vitlab.get_config("vit_tiny_patch16_224.mystery")


def test_a_torchvision_resnet_file_is_named_as_what_it_is(tmp_path, capsys):
    import torchvision

    path = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), path)
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert "a ResNet state dict with BatchNorm" in err and "BiT-R50x1" in err and "pass the format" not in err


def test_a_peer_name_where_a_checkpoint_is_expected_names_its_weights(hub_cache):
    """`vitlab.load("vit_tiny_patch16_224.augreg_in21k_ft_in1k")`: the tag selects timm's
    weights, as timm.create_model(NAME, pretrained=True) does; a Hugging Face name its repo."""
    from hub_standin import TIMM, timm_repo_files
    from vitlab.checkpoints import hub

    assert hub.peer_weights(TIMM) == f"timm:{TIMM.split('.')[0]}.{TIMM.split('.')[1]}"
    assert hub.peer_weights("google/vit-base-patch16-224") == "hf-hub:google/vit-base-patch16-224"
    assert hub.is_pretrained_name(TIMM) and not hub.is_pretrained_name("ViT-B/16")
    files, _ = timm_repo_files()
    hub_cache.add("timm/" + TIMM, files)
    assert vitlab.load(TIMM).config.num_classes == vitlab.load("timm:" + TIMM).config.num_classes


def test_list_models_reads_a_peer_name():
    assert vitlab.list_models("vit_tiny_patch16_224") == ["ViT-Ti/16"]
    assert vitlab.list_models("google/vit-large-patch16-224") == ["ViT-L/16"]


def test_timm_patterns_list_the_variants_and_a_slipped_resolution_is_refused(capsys):
    """`vitlab models 'vit_tiny*'` lists the variants timm calls so; `vit_tiny_patch16_22`
    (a lost 4) is refused with the near name, as a model and where a checkpoint is expected,
    not read as a 22 px model."""
    assert "ViT-Ti/16" in vitlab.list_models("vit_tiny*") and "ViT-B/16" not in vitlab.list_models("vit_tiny*")
    assert "R50+ViT-B/16" in vitlab.list_models("vit_base_r50*") and "ViT-B/16" not in vitlab.list_models("vit_base_r50*")
    assert main(["models", "vit_small_patch16*"]) == 0 and "ViT-S/16" in capsys.readouterr().out
    with pytest.raises(vitlab.ConfigError, match=r"did you mean vit_tiny_patch16_224\?"):
        vitlab.create_model("vit_tiny_patch16_22")
    assert main(["info", "vit_tiny_patch16_22"]) == 2
    assert "did you mean vit_tiny_patch16_224?" in capsys.readouterr().err
