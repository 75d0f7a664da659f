"""vitlab.bench.ceiling: the products timed are the model's own Dense layers."""

from __future__ import annotations

import pytest
import torch

from vitlab.api import create_model, get_config
from vitlab.bench import PRECISIONS
from vitlab.bench.ceiling import CEILING_OF, ceiling_call, gemm_shapes, kernels


def test_the_shapes_are_one_blocks_dense_layers():
    assert gemm_shapes(get_config("ViT-B/16")) == (197, [(768, 2304), (768, 768), (768, 3072), (3072, 768)])
    cfg = get_config("ViT-C/4", depth=1)
    block = create_model(cfg).blocks[0]
    dense = [block.attn.qkv, block.attn.proj, block.mlp.fc1, block.mlp.fc2]
    assert gemm_shapes(cfg) == (65, [(fc.in_features, fc.out_features) for fc in dense])


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_flops_count_every_row_of_every_product(precision):
    cfg = get_config("ViT-C/4", depth=1, image_size=16)  # 16 patches + class token
    m = 3 * 17
    for kernel in kernels(precision):
        fn, flops = ceiling_call(cfg, 3, precision, kernel=kernel)
        assert flops == sum(2 * m * k * n for k, n in gemm_shapes(cfg)[1])
        assert [tuple(y.shape) for y in fn()] == [(m, n) for _, n in gemm_shapes(cfg)[1]]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_kernel_computes_the_same_products(precision):
    cfg = get_config("ViT-C/4", depth=1, image_size=16)
    if len(kernels(precision)) < 2:
        pytest.skip("only one kernel library here")
    reference, _ = ceiling_call(cfg, 2, precision, kernel="F.linear")
    packed, _ = ceiling_call(cfg, 2, precision, kernel="oneDNN")
    for a, b in zip(reference(), packed(), strict=True):
        torch.testing.assert_close(b.float(), a.float(), rtol=1e-2 if precision == "bf16" else 1e-5, atol=1e-3)


def test_every_precision_has_a_product_dtype():
    assert set(PRECISIONS) <= set(CEILING_OF)
    assert CEILING_OF["bf16-autocast"] == "bf16" and CEILING_OF["fp32-packed"] == "fp32"
    with pytest.raises(KeyError):
        ceiling_call(get_config("ViT-C/4", depth=1), 1, "fp8")
    with pytest.raises(ValueError, match="unknown kernel"):
        ceiling_call(get_config("ViT-C/4", depth=1), 1, "fp32", kernel="cuBLAS")
