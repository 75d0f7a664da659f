"""`vitlab convert` and `vitlab info` on every format, from the command line's entry point."""

from __future__ import annotations

import json

import pytest
import torch

import vitlab
from vitlab.cli import main

TARGETS = {"vitlab": "m.safetensors", "npz": "m.npz", "timm": "m_timm.safetensors", "hf": "m_hf", "torchvision": "m_tv.pth"}


@pytest.fixture
def source(tmp_path):
    torch.manual_seed(0)
    model = vitlab.create_model("ViT-Ti/16", depth=2, image_size=32, num_classes=3, gelu="exact")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.class_names = ["a", "b", "c"]
    path = tmp_path / "src.safetensors"
    vitlab.save(model, path)
    return path, model


@pytest.mark.slow
def test_convert_to_every_format_and_info_reads_it(tmp_path, source, capsys):
    src, model = source
    for target, name in TARGETS.items():
        extra = ["--allow-numerics-change"] if target == "npz" else []  # exact GELU -> the official tanh form
        assert main(["convert", str(src), str(tmp_path / name), "--to", target, *extra]) == 0
        out = capsys.readouterr().out
        assert f"wrote  {tmp_path / name}  ({target})" in out
        # npz stores no GELU form: its reader's official tanh form moves the logits, and says so
        assert ("from the settings it does not carry" if target == "npz" else "gives identical logits") in out
        assert main(["info", str(tmp_path / name), "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["format"] == target
        assert info["params"] == sum(p.numel() for p in model.parameters())
        assert info["config"]["hidden_size"] == 192 and info["config"]["depth"] == 2
    # and from each format back to vitlab, bit-exact
    for target, name in TARGETS.items():
        out = tmp_path / f"back_{target}.safetensors"
        assert main(["convert", str(tmp_path / name), str(out)]) == 0
        back = vitlab.load(out).state_dict()
        assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


def test_convert_refuses_to_overwrite_and_names_the_feature(tmp_path, source, capsys):
    src, _ = source
    dst = tmp_path / "m.npz"
    dst.write_bytes(b"precious")
    assert main(["convert", str(src), str(dst), "--allow-numerics-change"]) == 2
    assert "exists; pass --force" in capsys.readouterr().err and dst.read_bytes() == b"precious"
    assert main(["convert", str(src), str(dst), "--force", "--allow-numerics-change"]) == 0
    capsys.readouterr()
    assert main(["convert", str(src), str(tmp_path / "x.npz")]) == 2
    assert "gelu='exact'" in capsys.readouterr().err
    gap = vitlab.create_model("ViT-Ti/16", depth=1, image_size=32, classifier="gap")
    vitlab.save(gap, tmp_path / "gap.safetensors")
    assert main(["convert", str(tmp_path / "gap.safetensors"), str(tmp_path / "gap_hf"), "--to", "hf"]) == 2
    assert "classifier='gap'" in capsys.readouterr().err and not (tmp_path / "gap_hf").exists()
    assert main(["convert", str(src), str(tmp_path / "noext")]) == 2
    assert "pass --to" in capsys.readouterr().err


def test_from_overrides_detection(tmp_path, source, capsys):
    src, model = source
    assert main(["convert", str(src), str(tmp_path / "t.bin"), "--to", "timm"]) == 0
    assert main(["convert", str(tmp_path / "t.bin"), str(tmp_path / "v.safetensors"), "--from", "timm"]) == 0
    assert "(timm:" in capsys.readouterr().out
