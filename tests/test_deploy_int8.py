"""vitlab.deploy.int8: calibrated int8 on oneDNN, checked against its own arithmetic and fp32."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import vitlab
from vitlab import deploy
from vitlab.data.transforms import eval_transform
from vitlab.deploy import int8
from vitlab.models.layers import Dense

CIFAR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "cifar10"
pytestmark = pytest.mark.skipif(not int8.available(), reason="this PyTorch build has no oneDNN int8 kernels")


def model(**overrides) -> vitlab.VisionTransformer:
    torch.manual_seed(0)
    return vitlab.create_model("ViT-C/4", head_init="xavier", **overrides).eval()


def dequantized_product(layer: int8.CalibratedInt8Linear, dense: Dense, x: torch.Tensor) -> torch.Tensor:
    """What the layer should compute, in float64 from its own rounded numbers."""
    q = layer.quantize(x).double() - layer.x_zero  # (..., in)
    w = torch.round(dense.weight.double() / layer.weight_scale.double()[:, None]).clamp(-127, 127)
    return (q @ w.t()) * layer.x_scale * layer.weight_scale.double() + dense.bias.double()


@torch.no_grad()
def test_the_int8_layer_is_the_rounded_product():
    torch.manual_seed(0)
    dense = Dense(64, 48)
    x = torch.randn(2, 5, 64)
    layer = int8.CalibratedInt8Linear(dense, (float(x.min()), float(x.max())), out_dtype=torch.float32)
    torch.testing.assert_close(layer(x).double(), dequantized_product(layer, dense, x), atol=1e-4, rtol=1e-4)
    # Close to the float layer: two roundings cost about 1% of the output scale.
    ref = dense(x)
    assert (layer(x) - ref).abs().max() < 0.03 * ref.abs().max()


@torch.no_grad()
def test_the_extreme_levels_multiply_exactly_on_this_cpu():
    """Inputs at the top level times weights at +-127, the case that saturates int16 pairs on
    CPUs without VNNI: the layer's levels are chosen so that the product stays exact."""
    dense = Dense(256, 4)
    with torch.no_grad():
        dense.weight.copy_(torch.tensor([1.0, -1.0, 0.5, -0.25]).repeat_interleave(256).reshape(4, 256))
        dense.bias.zero_()
    x = torch.full((3, 256), 2.0)
    layer = int8.CalibratedInt8Linear(dense, (0.0, 2.0), out_dtype=torch.float32)
    assert int(layer.quantize(x).max()) == layer.top == int8.activation_top()
    torch.testing.assert_close(layer(x).double(), dequantized_product(layer, dense, x), atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(layer(x), dense(x), rtol=1e-2, atol=0.0)


@torch.no_grad()
def test_gelu_is_fused_and_a_uint8_output_is_the_next_layers_input():
    torch.manual_seed(1)
    dense = Dense(32, 40, gelu="tanh")
    x = torch.randn(7, 32)
    h = F.gelu(dequantized_product(int8.CalibratedInt8Linear(dense, (-4.0, 4.0)), dense, x), approximate="tanh")
    layer = int8.CalibratedInt8Linear(dense, (-4.0, 4.0), out_range=(float(h.min()), float(h.max())))
    out = layer(x)
    assert out.dtype == torch.uint8
    # Dequantised, the uint8 output is the GELU of the product to within one level.
    got = (out.double() - layer.out_zero) * layer.out_scale
    assert (got - h).abs().max() <= 1.01 * layer.out_scale


@torch.no_grad()
def test_smoothing_computes_the_same_function():
    m = model(depth=1).double()
    block = m.blocks[0]
    x = torch.randn(2, 65, 192, dtype=torch.float64) * torch.linspace(0.1, 20, 192, dtype=torch.float64)
    want = block.attn.qkv(block.norm1(x))
    ranges = torch.stack([block.norm1(x).reshape(-1, 192).amin(0), block.norm1(x).reshape(-1, 192).amax(0)])
    smoothed = int8.smooth(block.norm1, block.attn.qkv, ranges)
    torch.testing.assert_close(block.attn.qkv(block.norm1(x)), want, atol=1e-10, rtol=1e-10)
    # The outlier channels' range shrank: that is what smoothing is for.
    assert smoothed.abs().amax() < ranges.abs().amax()


def test_the_copy_leaves_the_model_alone():
    m = model(depth=2)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    x = torch.randn(4, 3, 32, 32)
    q8 = deploy.quantize_int8(m, calibration=x)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert all(isinstance(b.mlp.fc1, int8.CalibratedInt8Linear) for b in q8.model.blocks)
    assert q8.model.blocks[0].mlp.fc1.out_dtype is None  # uint8 straight into fc2
    with torch.inference_mode():
        out = q8(x)
    assert out.dtype == torch.float32 and out.shape == (4, 10)


def test_the_calibrated_copy_keeps_its_float_parts_in_a_dtype_this_cpu_runs(tmp_path):
    # oneDNN writing bf16 on a CPU without bf16 falls back to a loop 45-80x slower than fp32
    # (6 s an image on an AVX2 EPYC): the copy must pick fp32 there, bf16 where it runs.
    from vitlab.deploy import onednn_dtypes

    q8 = deploy.quantize_int8(model(depth=1), calibration=torch.randn(4, 3, 32, 32))
    rest = int8.rest_dtype()
    assert rest in onednn_dtypes() and q8.dtype == rest
    assert q8.model.norm.weight.dtype == rest and q8.model.blocks[0].attn.qkv.out_dtype == rest
    assert q8.serving == "int8, calibrated"
    with pytest.raises(vitlab.checkpoints.CheckpointError, match=r"save it with vitlab\.deploy\.save_int8"):
        vitlab.save(q8, tmp_path / "q8.safetensors")
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def cifar() -> tuple[torch.Tensor, torch.Tensor]:
    """64 training images to calibrate on and 128 test images to compare on."""
    if not (CIFAR / "test-000000.tar.gz").exists():
        pytest.skip(f"real CIFAR-10 shards not found at {CIFAR}")
    from vitlab.data import open_dataset

    def first(split: str, n: int) -> torch.Tensor:
        return torch.stack([x for x, _ in itertools.islice(iter(open_dataset(f"wds:{CIFAR}", split, eval_transform(32))), n)])

    return first("train", 64), first("test", 128)


@pytest.mark.slow
def test_calibrated_int8_agrees_with_fp32_on_cifar(cifar):
    calibration, images = cifar
    m = model()
    result = deploy.agreement(m, deploy.quantize_int8(m, calibration=calibration), images)
    assert result.count == 128 and result.top1 >= 0.95, str(result)
    with torch.inference_mode():
        spread = m(images).std().item()
    assert result.max_abs_diff < 0.25 * spread, str(result)


def test_a_calibrated_copy_saves_and_reloads_with_identical_logits(tmp_path, cifar, capsys):
    """save_int8(quantize_int8(m, calibration=x)): the int8 weights, the static activation
    scales and the smoothed LayerNorms travel in the file; the copy read back gives the same
    logits bit for bit on real images, `vitlab info` describes it, and it refuses export and
    vitlab.load in one line each."""
    from vitlab.cli import main

    calibration, images = cifar
    m = model(depth=2)
    m.class_names = [f"c{i}" for i in range(10)]
    q8 = deploy.quantize_int8(m, calibration=calibration)
    deploy.save_int8(q8, tmp_path / "q8.safetensors")
    back = deploy.load_int8(tmp_path / "q8.safetensors")
    assert back.serving == "int8, calibrated" and back.dtype == q8.dtype and back.class_names == m.class_names
    with torch.inference_mode():
        assert torch.equal(back(images), q8(images))
    assert main(["info", str(tmp_path / "q8.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "int8, calibrated serving copy (8 int8 weight tensors" in out and "load_int8" in out
    with pytest.raises(vitlab.checkpoints.CheckpointError, match=r"deploy\.load_int8"):
        vitlab.load(tmp_path / "q8.safetensors")
    assert main(["export", str(tmp_path / "q8.safetensors"), "--format", "torch-export", "--out",
                 str(tmp_path / "q8.pt2")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "export the model itself" in err
