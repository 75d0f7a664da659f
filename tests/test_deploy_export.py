"""ONNX and torch.export (vitlab.deploy.export, `vitlab export`)."""

from __future__ import annotations

import pytest
import torch

import vitlab
from vitlab import deploy
from vitlab.cli import main


def small(**overrides) -> vitlab.VisionTransformer:
    torch.manual_seed(0)
    return vitlab.create_model("ViT-C/4", depth=2, head_init="xavier", **overrides).eval()


@pytest.mark.slow
def test_onnx_has_a_dynamic_batch_and_matches_pytorch(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    m = small()
    path = deploy.export_onnx(m, tmp_path / "m.onnx")
    graph = onnx.load(str(path)).graph
    batch_dim = graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param and not batch_dim.dim_value  # symbolic, not a fixed size
    assert deploy.check_onnx(path, m, batch_sizes=(1, 3, 7)) < 1e-4


def test_torch_export_roundtrip(tmp_path):
    m = small()
    deploy.export_program(m, tmp_path / "m.pt2")
    assert deploy.check_program(tmp_path / "m.pt2", m, batch_sizes=(1, 5)) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("fmt,suffix", [("onnx", "onnx"), ("torch-export", "pt2")])
def test_export_cli_at_trained_and_resized_resolution(tmp_path, capsys, fmt, suffix):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    ckpt = tmp_path / "m.safetensors"
    vitlab.save(small(), ckpt)
    assert main(["export", str(ckpt), "--format", fmt, "--out", str(tmp_path / f"a.{suffix}")]) == 0
    out = capsys.readouterr().out
    assert "32x32" in out and ": ok" in out
    # A resized position embedding is baked in before export: still clean.
    if fmt == "onnx":
        assert main(["export", str(ckpt), "--format", fmt, "--out", str(tmp_path / f"b.{suffix}"), "--image-size", "48"]) == 0
        out = capsys.readouterr().out
        assert "48x48" in out and ": ok" in out


def test_export_cli_errors(tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing.safetensors"), "--format", "onnx", "--out", str(tmp_path / "x.onnx")]) == 2
    assert "missing.safetensors" in capsys.readouterr().err
    ckpt = tmp_path / "m.safetensors"
    vitlab.save(small(), ckpt)
    assert main(["export", str(ckpt), "--format", "torch-export", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
