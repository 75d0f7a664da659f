"""vitlab's own checkpoint format: round trips, overrides, and files that are not right."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import vitlab
from vitlab.checkpoints import CheckpointError


def perturbed(name="ViT-C/4", **overrides):
    """A model whose biases and norm parameters are away from their initial values."""
    torch.manual_seed(0)
    base = dict(image_size=16, depth=2, head_init="xavier")
    base.update(overrides)
    model = vitlab.create_model(name, **base)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.mark.parametrize(
    "overrides",
    [{}, {"classifier": "gap", "pos_embed": "learned_2d"}, {"pos_embed": "relative", "representation_size": 16}],
)
def test_round_trip_is_bit_exact(tmp_path, overrides):
    model = perturbed(**overrides)
    model.class_names = [f"class {i}" for i in range(10)]
    path = tmp_path / "model.safetensors"
    vitlab.save(model, path)
    loaded = vitlab.load(path)
    assert loaded.config == model.config
    assert loaded.class_names == model.class_names
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(loaded(x), model(x))


def test_hybrid_round_trip(tmp_path):
    model = perturbed("R26+ViT-S/32", image_size=64, depth=1, num_classes=4)
    vitlab.save(model, tmp_path / "h.safetensors")
    loaded = vitlab.load(tmp_path / "h.safetensors")
    x = torch.randn(1, 3, 64, 64)
    assert torch.equal(loaded(x), model(x))


def test_overrides_on_load(tmp_path):
    model = perturbed(representation_size=16)
    path = tmp_path / "m.safetensors"
    vitlab.save(model, path)
    fresh = vitlab.load(path, num_classes=3, representation_size=None)
    assert fresh.pre_logits is None and fresh.config.num_classes == 3
    assert fresh.head.weight.abs().sum() == 0  # a new zero-initialised head, as for fine-tuning
    assert torch.equal(fresh.blocks[1].mlp.fc1.weight, model.blocks[1].mlp.fc1.weight)


def test_checkpoint_holds_config_and_metadata(tmp_path):
    model = perturbed()
    path = tmp_path / "m.safetensors"
    vitlab.save(model, path)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["format"] == "vitlab"
    assert json.loads(meta["config"])["hidden_size"] == 192
    assert json.loads(meta["config"])["mean"] == [0.5, 0.5, 0.5]


def test_a_file_that_is_not_a_checkpoint(tmp_path):
    bad = tmp_path / "notes.safetensors"
    bad.write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(CheckpointError, match="notes.safetensors"):
        vitlab.load(bad)
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        vitlab.load(tmp_path / "missing.safetensors")


def test_a_truncated_checkpoint_names_the_file(tmp_path):
    model = perturbed()
    path = tmp_path / "cut.safetensors"
    vitlab.save(model, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.safetensors"):
        vitlab.load(path, format="vitlab")


def test_tensors_that_do_not_fit_the_config_name_key_and_shapes(tmp_path):
    model = perturbed()
    path = tmp_path / "m.safetensors"
    vitlab.save(model, path)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    state = load_file(str(path))
    state["blocks.0.mlp.fc1.weight"] = state["blocks.0.mlp.fc1.weight"][:100]
    del state["norm.bias"]
    state["extra.weight"] = torch.zeros(2)
    save_file(state, str(tmp_path / "broken.safetensors"), metadata=meta)
    with pytest.raises(CheckpointError) as err:
        vitlab.load(tmp_path / "broken.safetensors")
    msg = str(err.value)
    assert "broken.safetensors" in msg
    assert "fc1.weight: file (100, 192) vs model" in msg
    assert "norm.bias" in msg and "extra.weight" in msg


def test_save_is_atomic_and_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    model = perturbed()
    path = tmp_path / "m.safetensors"
    vitlab.save(model, path)
    before = path.read_bytes()
    import safetensors.torch

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        vitlab.save(model, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]  # no temporary left behind


def test_extra_tensors_travel_apart_from_the_model(tmp_path):
    from vitlab.checkpoints import io

    model = perturbed()
    path = tmp_path / "m.safetensors"
    io.write(model, path, extra_metadata={"objective": "demo"}, extra_tensors={"head.weight": torch.ones(3, 2)})
    imported = io.read(path)
    assert torch.equal(imported.extras["head.weight"], torch.ones(3, 2))
    assert imported.metadata["objective"] == "demo"
    loaded = vitlab.load(path)  # the extras are not part of the classifier
    assert torch.equal(loaded.head.weight, model.head.weight)
