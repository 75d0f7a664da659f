"""Sharing on the Hub: the folder every library reads, the model card, the upload.

The upload runs huggingface_hub's own client against a local stand-in of the Hub's HTTP API
(tests/hub_standin.py: a real server on 127.0.0.1, not a patched HfApi, so the payloads,
headers and error handling are huggingface_hub's own); the pushed repo is then downloaded
back, and read by transformers and timm from the Hub cache."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

import vitlab
from conftest import logits, perturb
from vitlab.checkpoints import share
from vitlab.checkpoints.io import CheckpointError
from vitlab.cli import main

SUMMARY = {"steps": 300, "epochs": 1.5, "checkpoint": "", "splits": {"test": {"top1": 0.8125, "top5": 0.97, "loss": 0.61}}}


def tiny(num_classes=4):
    torch.manual_seed(0)
    model = perturb(vitlab.create_model("ViT-Ti/4", hidden_size=32, depth=2, num_heads=2, mlp_dim=64,
                                        num_classes=num_classes, gelu="exact"))
    model.class_names = ["cat", "dog", "ship", "truck"][:num_classes]
    return model


def make_run(tmp_path, model):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    vitlab.save(model, run / "checkpoints" / "last.safetensors")
    (run / "summary.json").write_text(json.dumps({**SUMMARY, "checkpoint": str(run / "checkpoints" / "last.safetensors")}))
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"name": "cifar10", "train_split": "train"},
                                                     "train": {"batch_size": 64, "steps": 300}}))
    return run


def test_the_folder_reads_in_vitlab_transformers_and_timm(tmp_path, hub_cache):
    model = tiny()
    folder = tmp_path / "share"
    files = share.write_folder(model, folder, "me/tiny", make_run(tmp_path, model))
    assert files == ["config.json", "model.safetensors.index.json", "transformers_model.safetensors",
                     "preprocessor_config.json", "timm_model.safetensors", "README.md"]
    x = torch.randn(2, 3, 32, 32)
    back = vitlab.load(folder)
    assert back.class_names == model.class_names and torch.allclose(logits(back, x), logits(model, x), atol=0)

    from transformers import ViTForImageClassification

    peer = ViTForImageClassification.from_pretrained(folder).eval()
    assert torch.allclose(logits(peer, x), logits(model, x), atol=1e-9)
    assert peer.config.id2label[1] == "dog"

    import timm
    from timm.data import resolve_data_config

    hub_cache.add("me/tiny", {n: (folder / n).read_bytes() for n in files})
    timm_model = timm.create_model("hf-hub:me/tiny", pretrained=True).eval()
    assert torch.allclose(logits(timm_model, x), logits(model, x), atol=1e-9)
    data = resolve_data_config(model=timm_model)
    assert data["input_size"] == (3, 32, 32) and data["crop_pct"] == 1.0 and tuple(data["mean"]) == (0.5, 0.5, 0.5)


def test_model_card(tmp_path):
    model = tiny()
    card = share.model_card(model, "me/tiny", share.run_facts(make_run(tmp_path, model)))
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    assert yaml.safe_load(front)["pipeline_tag"] == "image-classification"
    assert "width 32, depth 2, 2 heads" in body and "Trained on CIFAR-10 (`cifar10`)" in body and "300 steps of batch 64" in body
    assert "| test | 81.25% | 97.00% | 0.6100 |" in body and "Classes: cat, dog, ship, truck." in body
    for line in ('vitlab.load("hf-hub:me/tiny")', 'ViTForImageClassification.from_pretrained("me/tiny")',
                 'timm.create_model("hf-hub:me/tiny", pretrained=True)'):
        assert line in body
    # A model timm cannot build says so instead of giving a snippet that would fail.
    model_hf_eps = vitlab.create_model("ViT-Ti/4", depth=1, layer_norm_eps=1e-12)
    assert "no timm weights in this repo" in share.model_card(model_hf_eps, "me/x", {}, share.timm_readable(model_hf_eps))


def test_push_uploads_with_the_token_and_loads_back(tmp_path, standin_hub, capsys):
    model = tiny()
    run = make_run(tmp_path, model)
    assert main(["push", str(run), "--repo", "me/tiny", "--private"]) == 0
    out = capsys.readouterr().out
    assert "pushed" in out and standin_hub.url in out and standin_hub.private["me/tiny"]
    uploaded = standin_hub.files("me/tiny")
    assert set(uploaded) == {"config.json", "model.safetensors.index.json", "transformers_model.safetensors",
                             "preprocessor_config.json", "timm_model.safetensors", "README.md"}
    assert b"81.25%" in uploaded["README.md"]
    assert set(standin_hub.authorizations) == {"Bearer hf_test_token"}
    back = vitlab.load("hf-hub:me/tiny")  # downloaded from the stand-in into the cache
    assert back.class_names == model.class_names and torch.equal(back.head.weight, model.head.weight)
    # A second push is a second commit on the same repo; vitlab.save does the same from Python.
    model.head.bias.data += 1
    vitlab.save(model, "hf-hub:me/tiny", run=run)
    assert len(standin_hub.repos["me/tiny"]) == 2
    assert torch.equal(vitlab.load("hf-hub:me/tiny").head.bias, model.head.bias)


def test_push_refused_names_the_token(standin_hub):
    standin_hub.require_token = "the-right-one"
    with pytest.raises(CheckpointError, match="HF_TOKEN to a token with write access"):
        share.push(tiny(), "hf-hub:me/tiny")


def test_push_offline_and_folder_only(tmp_path, hub_cache, capsys):
    with pytest.raises(CheckpointError, match="offline mode is on"):
        vitlab.save(tiny(), "hf-hub:me/tiny")
    ckpt = tmp_path / "m.safetensors"
    vitlab.save(tiny(), ckpt)
    assert main(["push", str(ckpt), "--repo", "me/tiny", "--folder", str(tmp_path / "out")]) == 0
    assert "nothing uploaded" in capsys.readouterr().out and (tmp_path / "out" / "README.md").is_file()
    assert main(["push", str(ckpt), "--repo", "me/tiny@v1", "--folder", str(tmp_path / "x")]) == 2
