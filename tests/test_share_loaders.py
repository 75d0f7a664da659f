"""A `vitlab push --folder` output that timm's `local-dir:` loader and transformers'
`from_pretrained` both read, giving vitlab's logits on real digits images; and the model
card's license, model-index results, training hyper-parameters and dataset name."""

from __future__ import annotations

import pytest
import torch
import yaml

import vitlab
from vitlab.checkpoints import share
from vitlab.cli import main
from vitlab.data import make_loader, open_dataset


@pytest.fixture(scope="module")
def pushed(digits_run, tmp_path_factory):
    folder = tmp_path_factory.mktemp("push") / "vit-digits"
    assert main(["push", str(digits_run), "--repo", "me/vit-digits", "--folder", str(folder)]) == 0
    return folder


@pytest.fixture(scope="module")
def digits_batch(digits_run):
    model = vitlab.load(digits_run / "checkpoints" / "last.safetensors")
    ds = open_dataset("digits", "test", vitlab.transform(model))
    images, labels, _ = next(iter(make_loader(ds, 32, train=False)))
    with torch.no_grad():
        return model, images, model(images)


def test_timm_local_dir_gives_vitlabs_logits(pushed, digits_batch):
    timm = pytest.importorskip("timm")
    _, images, ours = digits_batch
    theirs = timm.create_model(f"local-dir:{pushed}", pretrained=True).eval()
    with torch.no_grad():
        assert torch.allclose(theirs(images), ours, atol=1e-4)
    assert theirs.pretrained_cfg["label_names"] == [str(i) for i in range(10)]


def test_transformers_from_pretrained_gives_vitlabs_logits(pushed, digits_batch):
    transformers = pytest.importorskip("transformers")
    _, images, ours = digits_batch
    theirs = transformers.ViTForImageClassification.from_pretrained(str(pushed)).eval()
    with torch.no_grad():
        assert torch.allclose(theirs(images).logits, ours, atol=1e-4)
    assert theirs.config.id2label[3] == "3"


def test_vitlab_reads_the_folder_back_bit_exactly(pushed, digits_batch):
    model, images, ours = digits_batch
    assert not (pushed / "model.safetensors").exists()  # timm would take it: transformers' weights are indexed
    with torch.no_grad():
        assert torch.equal(vitlab.load(pushed)(images), ours)


def test_the_card_has_license_results_hyperparameters_and_the_datasets_name(pushed, digits_run):
    text = (pushed / "README.md").read_text()
    meta = yaml.safe_load(text.split("---\n")[1])
    summary = share.run_facts(digits_run)["summary"]
    assert meta["license"] == "apache-2.0"
    (result,) = meta["model-index"][0]["results"]
    assert result["dataset"]["split"] == "test" and result["dataset"]["name"] == "scikit-learn's 8x8 digits"
    top1 = next(m for m in result["metrics"] if m["type"] == "accuracy")
    assert top1["value"] == round(100 * summary["splits"]["test"]["top1"], 2)
    config = yaml.safe_load((digits_run / "config.yaml").read_text())
    assert "## Training hyper-parameters" in text
    assert f"| learning rate | {config['optim']['lr']} |" in text
    assert f"| batch size | {config['train']['batch_size']} |" in text
    assert "dataset:wds" not in text


def test_a_recognised_dataset_is_named_and_tagged_by_its_hub_id(digits_run):
    facts = share.run_facts(digits_run)
    facts["config"]["data"]["name"] = "wds:../shared/data/c10"  # the path says nothing; the identity does
    model = vitlab.load(digits_run / "checkpoints" / "last.safetensors")
    meta = yaml.safe_load(share.model_card(model, "me/x", {**facts, "dataset": "cifar10"}, license="mit").split("---\n")[1])
    assert meta["license"] == "mit" and meta["datasets"] == ["cifar10"] and "dataset:cifar10" in meta["tags"]
    assert meta["model-index"][0]["results"][0]["dataset"]["name"] == "CIFAR-10"
    bare = yaml.safe_load(share.model_card(model, "me/x", facts).split("---\n")[1])
    assert "datasets" not in bare and not any(t.startswith("dataset:") for t in bare["tags"])
