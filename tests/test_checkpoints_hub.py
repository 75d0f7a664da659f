"""Checkpoints by name through huggingface_hub, tested offline against a Hub cache the test
builds in huggingface_hub's own layout (conftest.hub_cache), and online against a local
stand-in of the Hub (conftest.standin_hub). The repos mirror the real ones' files
(transformers' google/vit-base-patch16-224, timm's timm/vit_base_patch16_224.*) with tiny
weights, and each load is checked against the peer library reading the same cache."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import vitlab
from conftest import logits
from hub_standin import GOOGLE, TIMM, hf_repo_files, timm_repo_files
from vitlab.checkpoints import hub
from vitlab.checkpoints.io import CheckpointError
from vitlab.checkpoints.labels import imagenet_names, imagenet_synsets


def test_is_pretrained_name(tmp_path):
    assert hub.is_pretrained_name("hf-hub:google/vit-base-patch16-224")
    assert hub.is_pretrained_name("timm:" + TIMM) and hub.is_pretrained_name("ViT-B/16:imagenet21k")
    for path in ("runs/x/last.safetensors", "C:\\models\\x.npz", "s3://bucket/x", "", None, 3):
        assert not hub.is_pretrained_name(path)
    odd = tmp_path / "a:b"  # an existing file is a path whatever its name says
    odd.write_text("")
    assert not hub.is_pretrained_name(str(odd))
    assert hub.parse_hub_name("timm:" + TIMM) == hub.HubRepo("timm/" + TIMM, None, "timm")
    assert hub.parse_hub_name("hf-hub:org/x@v1") == hub.HubRepo("org/x", "v1", "any")
    with pytest.raises(CheckpointError, match="ORG/NAME"):
        hub.parse_hub_name("hf-hub:a/b/c")


def test_hf_repo_from_the_cache_matches_transformers(hub_cache, tmp_path):
    files, original = hf_repo_files(tmp_path)
    hub_cache.add(GOOGLE, files)
    model = vitlab.load("hf-hub:" + GOOGLE)
    assert model.class_names == original.class_names  # id2label
    assert (model.config.crop_fraction, model.config.crop_mode, model.config.interpolation) == (1.0, "squash", "bilinear")
    from transformers import ViTForImageClassification

    peer = ViTForImageClassification.from_pretrained(GOOGLE, cache_dir=str(hub_cache.root), local_files_only=True)
    x = torch.randn(2, 3, 224, 224)
    assert torch.allclose(logits(model, x), logits(peer.eval(), x), atol=1e-9)


def test_timm_name_from_the_cache_matches_timm(hub_cache):
    import timm

    files, timm_model = timm_repo_files()
    hub_cache.add("timm/" + TIMM, files)
    model = vitlab.load("timm:" + TIMM)
    cfg = model.config
    assert (cfg.crop_fraction, cfg.crop_mode, cfg.interpolation, cfg.num_heads) == (0.9, "center", "bicubic", 2)
    assert model.class_names == imagenet_names(1000)  # a 1000-class ImageNet checkpoint
    peer = timm.create_model("hf-hub:timm/" + TIMM, pretrained=True)  # timm reads the same cache
    x = torch.randn(2, 3, 224, 224)
    assert torch.allclose(logits(model, x), logits(peer.eval(), x), atol=1e-9)
    assert torch.allclose(logits(model, x), logits(timm_model, x), atol=1e-9)


def test_timm_label_names_as_synsets(hub_cache):
    files, _ = timm_repo_files(label_names=imagenet_synsets(1000))
    hub_cache.add("timm/" + TIMM, files)
    assert vitlab.load("timm:" + TIMM).class_names[:2] == ["tench", "goldfish"]


def test_registry_names_read_the_hub_copy(hub_cache):
    files, _ = timm_repo_files()
    entry = vitlab.checkpoints.pretrained.PRETRAINED["ViT-B/16:augreg-in21k-ft-in1k"]
    hub_cache.add(f"timm/{entry.timm_name}", files)
    model = vitlab.create_model("ViT-B/16:augreg-in21k-ft-in1k", pretrained=True)
    assert model.config.num_classes == 1000 and model.class_names[0] == "tench"
    with pytest.raises(vitlab.ConfigError, match="pretrained=True"):
        vitlab.create_model("ViT-B/16:augreg-in21k-ft-in1k")


def test_create_model_pretrained_picks_the_papers_weights(hub_cache, tmp_path):
    files, original = hf_repo_files(tmp_path, num_classes=0)
    hub_cache.add("google/vit-base-patch16-224-in21k", files)  # ViT-B/16:imagenet21k's Hub copy
    model = vitlab.create_model("ViT-B/16", pretrained=True, num_classes=10)
    assert model.config.num_classes == 10
    assert torch.equal(model.blocks[0].attn.qkv.weight, original.blocks[0].attn.qkv.weight)
    with pytest.raises(vitlab.ConfigError, match="no published weights for ViT-C/4"):
        vitlab.create_model("ViT-C/4", pretrained=True)


def test_revision_pinning(hub_cache, tmp_path):
    old_files, old = hf_repo_files(tmp_path, num_classes=3, seed=1)
    new_files, new = hf_repo_files(tmp_path, num_classes=3, seed=2)
    old_commit = hub_cache.add("org/model", old_files)
    hub_cache.add("org/model", new_files)  # main moves on
    weight = lambda m: m.blocks[0].mlp.fc1.weight  # noqa: E731
    assert torch.equal(weight(vitlab.load("hf-hub:org/model")), weight(new))
    assert torch.equal(weight(vitlab.load(f"hf-hub:org/model@{old_commit}")), weight(old))
    assert torch.equal(weight(vitlab.load("hf-hub:org/model", revision=old_commit)), weight(old))
    with pytest.raises(CheckpointError, match="revision"):
        vitlab.load(f"hf-hub:org/model@{old_commit}", revision="main")


def test_offline_error_says_what_to_do(hub_cache):
    with pytest.raises(CheckpointError) as e:
        vitlab.load("hf-hub:org/absent@v2")
    msg = str(e.value)
    assert "offline mode is on" in msg and "hf download org/absent --revision v2" in msg
    assert str(hub_cache.root) in msg
    # A registry name also says where the official file would go.
    with pytest.raises(CheckpointError, match=r"put the official file .*ViT-B_16\.npz"):
        vitlab.load("ViT-B/16:imagenet21k")


def test_offline_from_the_environment_in_a_fresh_process(hub_cache, tmp_path):
    """HF_HUB_OFFLINE=1 and HF_HUB_CACHE as a user sets them, before anything is imported."""
    files, _ = hf_repo_files(tmp_path, num_classes=3)
    hub_cache.add("org/model", files)
    code = "import vitlab; m = vitlab.load('hf-hub:org/model'); print(m.class_names)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "['thing 0', 'thing 1', 'thing 2']" in out.stdout
    cli = subprocess.run([sys.executable, "-m", "vitlab", "info", "hf-hub:org/missing"], capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 2 and "Traceback" not in cli.stderr
    assert cli.stderr.count("\n") == 1 and "HF_HUB_OFFLINE" in cli.stderr


def test_download_through_the_hub_api(standin_hub, tmp_path):
    """Online: huggingface_hub fetches only the files vitlab reads into its cache, sends the
    token from HF_TOKEN, and the copy then loads offline."""
    files, original = hf_repo_files(tmp_path, num_classes=3)
    standin_hub.repos["org/model"] = {"c1": {**files, "tf_model.h5": b"not needed"}}
    standin_hub.refs["org/model"] = {"main": "c1"}
    model = vitlab.load("hf-hub:org/model")
    assert torch.equal(model.head.weight, original.head.weight)
    assert "Bearer hf_test_token" in standin_hub.authorizations
    snapshot = next((tmp_path / "hf-cache").glob("models--org--model/snapshots/*"))
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors", "preprocessor_config.json"]
    with pytest.raises(CheckpointError, match="no such model repo"):
        vitlab.load("hf-hub:org/nothing")


def test_no_network_reads_the_cache_or_fails_at_once(hub_cache, tmp_path, monkeypatch):
    """Not offline, but the Hub cannot be reached: a cached repo still loads, a missing one
    fails within seconds (huggingface_hub alone would retry for ~25 s) and says so."""
    import time

    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    files, original = hf_repo_files(tmp_path, num_classes=3)
    hub_cache.add("org/model", files)
    assert torch.equal(vitlab.load("hf-hub:org/model").head.weight, original.head.weight)
    start = time.time()
    with pytest.raises(CheckpointError, match=r"no connection to http://127\.0\.0\.1:9"):
        vitlab.load("hf-hub:org/other")
    assert time.time() - start < 10
