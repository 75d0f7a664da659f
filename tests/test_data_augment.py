"""AutoAugment, TrivialAugment, AugMix and random erasing: torchvision's own transforms, set
from the config (data.*), the command line (--autoaugment, ...) and vitlab.transform, on real
CIFAR-10 images."""

from __future__ import annotations

import pytest
import torch
import yaml
from torchvision import transforms as T

import vitlab
from conftest import DIGITS_RUN
from vitlab.cli import main
from vitlab.config import ConfigError, RunConfig

OPTIONS = {  # option -> (value, the torchvision class it adds)
    "autoaugment": ("cifar10", T.AutoAugment),
    "trivialaugment": (True, T.TrivialAugmentWide),
    "augmix": (3, T.AugMix),
    "random_erasing": (0.5, T.RandomErasing),
}


@pytest.fixture(scope="module")
def cifar_images(cifar_dir_module):
    from vitlab.data import open_dataset
    from vitlab.data.transforms import eval_transform

    ds = open_dataset(f"wds:{cifar_dir_module}", "test", eval_transform(32))
    raw = []
    for k, (x, _) in enumerate(ds):
        raw.append(T.functional.to_pil_image(((x + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)))
        if k == 7:
            break
    return raw


@pytest.fixture(scope="module")
def cifar_dir_module():
    from conftest import SHARED_DATA

    path = SHARED_DATA / "cifar10"
    if not any(path.glob("train-*.tar*")):
        pytest.skip(f"needs the CIFAR-10 shards in {path}")
    return path


@pytest.mark.parametrize("option", list(OPTIONS))
def test_each_option_adds_torchvisions_transform_and_changes_images(option, cifar_images):
    model = vitlab.create_model("ViT-C/4")
    value, cls = OPTIONS[option]
    plain, augmented = vitlab.transform(model, train=True), vitlab.transform(model, train=True, **{option: value})
    assert sum(isinstance(t, cls) for t in augmented.augmentations) == 1
    assert not any(isinstance(t, cls) for t in plain.augmentations)
    changed = 0
    for seed, image in enumerate(cifar_images):
        torch.manual_seed(seed)
        a = plain(image)
        torch.manual_seed(seed)
        b = augmented(image)
        assert a.shape == b.shape == (3, 32, 32)
        changed += not torch.equal(a, b)
    assert changed >= len(cifar_images) // 2  # the op really runs (a policy may leave some images alone)


def test_random_erasing_erases_a_box_of_the_normalised_image(cifar_images):
    t = vitlab.transform(vitlab.create_model("ViT-C/4"), train=True, random_erasing=1.0)
    torch.manual_seed(0)
    x = t(cifar_images[0])
    zero = (x == 0).all(0)  # erased pixels are 0 in every channel, after normalising
    rows, cols = zero.any(1).nonzero().flatten(), zero.any(0).nonzero().flatten()
    assert zero.sum() >= 4 and bool(zero[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1].all())


def test_config_checks_the_options():
    with pytest.raises(ConfigError, match="data.autoaugment"):
        RunConfig.from_dict({"data": {"autoaugment": "imagenet21k"}})
    with pytest.raises(ConfigError, match="data.random_erasing"):
        RunConfig.from_dict({"data": {"random_erasing": 1.5}})


def test_the_flags_reach_a_training_run_on_greyscale_digits(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), *DIGITS_RUN[4:], "--steps", "2", "--ckpt-every", "2", "optim.warmup_steps=1",
            "--autoaugment", "imagenet", "--trivialaugment", "--augmix", "--random-erasing", "0.25"]
    assert main(argv) == 0, capsys.readouterr().err
    data = yaml.safe_load((out / "config.yaml").read_text())["data"]
    assert (data["autoaugment"], data["trivialaugment"], data["augmix"], data["random_erasing"]) == ("imagenet", True, 3, 0.25)
