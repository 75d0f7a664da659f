"""The matrix-product ceiling: how fast this machine multiplies at the model's own shapes.

A ViT's time is mostly its Dense layers (paper §3.1, Eq. 2-3: qkv, the attention projection,
the two MLP layers). Timing exactly those products, M = batch x tokens rows, in the system's
dtype and in the same rounds as the systems, gives the rate a perfect implementation could
reach on this machine today; each system's figure is then a fraction of it.

The same products can run on more than one kernel library, and which is faster depends on
the CPU: PyTorch sends fp32 products to MKL, whose AVX-512 code runs only on Intel CPUs (on an
AMD EPYC it runs AVX2 at half the rate), while oneDNN runs AVX-512 on both. Each kernel is
timed, and the ceiling is the fastest: a system is measured against the best this machine
can do, not against the library PyTorch happens to pick.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from vitlab.config import BiTConfig, ModelConfig
from vitlab.deploy.onednn import onednn_dtypes

# The product dtype each system precision runs its Dense layers in.
CEILING_OF = {"fp32": "fp32", "fp32-packed": "fp32", "fp32-auto": "fp32", "bf16-autocast": "bf16", "bf16": "bf16",
              "fp16-autocast": "fp16", "fp16": "fp16", "int8": "int8"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def ceiling_precision(precision: str) -> str:
    return CEILING_OF[precision]


def gemm_shapes(cfg: ModelConfig) -> tuple[int, list[tuple[int, int]]]:
    """(rows per image, (in, out) of each product): the Dense layers of one encoder block
    (Eq. 2-3), or for a BiT ResNet the two 1x1 convolutions of a unit of its third stage
    (where most of its FLOPs are), as matrix products over the map's positions."""
    if isinstance(cfg, BiTConfig):
        s = min(2, len(cfg.layers) - 1)
        stride = (4 if cfg.stem == "bit" else 1) * 2**s
        mid = cfg.stage_widths[s]
        return (cfg.image_size[0] // stride) * (cfg.image_size[1] // stride), [(4 * mid, mid), (mid, 4 * mid)]
    d = cfg.hidden_size
    return cfg.num_tokens, [(d, 3 * d), (d, d), (d, cfg.mlp_dim), (cfg.mlp_dim, d)]


def kernels(precision: str, device: str = "cpu") -> list[str]:
    """The kernels timed for a product dtype on a device."""
    if precision == "int8":
        return ["_int_mm"]
    if torch.device(device).type == "cpu" and precision in ("fp32", "bf16") and DTYPES[precision] in onednn_dtypes():
        return ["F.linear", "oneDNN"]
    return ["F.linear"]


def ceiling_call(cfg: ModelConfig, batch: int, precision: str, device: str = "cpu",
                 kernel: str = "F.linear") -> tuple[Callable[[], list[torch.Tensor]], float]:
    """The products of one block at batch `batch`: (a call doing them and returning the
    products, FLOPs per call).

    `precision` is a product dtype ("fp32", "bf16", "fp16", "int8"); `kernel` one of
    `kernels(precision, device)`: "F.linear" with (out, in) weights as the models hold them
    (the same rate as a plain matmul, measured), "oneDNN" with the weights packed once into
    its blocked layout, "_int_mm" for int8 with int32 accumulation.
    """
    rows, shapes = gemm_shapes(cfg)
    m = batch * rows
    flops = float(sum(2 * m * k * n for k, n in shapes))
    g = torch.Generator().manual_seed(0)
    if precision == "int8":
        xs = [torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g).to(device) for k, _ in shapes]
        ws = [torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g).to(device) for k, n in shapes]

        def products() -> list[torch.Tensor]:
            return [torch._int_mm(x, w.t()) for x, w in zip(xs, ws, strict=True)]

        return products, flops
    dtype = DTYPES[precision]
    xs = [torch.randn(m, k, generator=g).to(device, dtype) for k, _ in shapes]
    ws = [torch.randn(n, k, generator=g).to(device, dtype) for k, n in shapes]
    if kernel == "oneDNN":
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, m) for w in ws]

        def packed_products() -> list[torch.Tensor]:
            return [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for x, w in zip(xs, packed, strict=True)]

        return packed_products, flops
    if kernel != "F.linear":
        raise ValueError(f"unknown kernel {kernel!r}; choose from {', '.join(kernels(precision, device))}")

    def linear_products() -> list[torch.Tensor]:
        return [F.linear(x, w) for x, w in zip(xs, ws, strict=True)]

    return linear_products, flops
