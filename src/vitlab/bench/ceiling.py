"""The matrix-product ceiling: how fast this machine multiplies at the model's own shapes.

A ViT's time is mostly its Dense layers (paper §3.1, Eq. 2-3: qkv, the attention projection,
the two MLP layers). Timing exactly those products, M = batch x tokens rows, in the system's
dtype and in the same rounds as the systems, gives the rate a perfect implementation could
reach on this machine today; each system's figure is then a fraction of it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from vitlab.config import ViTConfig

# The product dtype each system precision runs its Dense layers in.
CEILING_OF = {"fp32": "fp32", "fp32-packed": "fp32", "bf16-autocast": "bf16", "bf16": "bf16",
              "fp16-autocast": "fp16", "fp16": "fp16", "int8": "int8"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def ceiling_precision(precision: str) -> str:
    return CEILING_OF[precision]


def gemm_shapes(cfg: ViTConfig) -> list[tuple[int, int]]:
    """(in, out) of the Dense layers of one encoder block (Eq. 2-3)."""
    d = cfg.hidden_size
    return [(d, 3 * d), (d, d), (d, cfg.mlp_dim), (cfg.mlp_dim, d)]


def ceiling_call(cfg: ViTConfig, batch: int, precision: str, device: str = "cpu") -> tuple[Callable[[], None], float]:
    """The products of one block at batch `batch`: (a call doing them, FLOPs per call).

    `precision` is a product dtype ("fp32", "bf16", "fp16", "int8"); int8 is `torch._int_mm`
    with int32 accumulation, the others `F.linear` with (out, in) weights as the models hold
    them (the same rate as a plain matmul, measured).
    """
    m = batch * cfg.num_tokens
    shapes = gemm_shapes(cfg)
    flops = float(sum(2 * m * k * n for k, n in shapes))
    g = torch.Generator().manual_seed(0)
    if precision == "int8":
        xs = [torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g).to(device) for k, _ in shapes]
        ws = [torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g).to(device) for k, n in shapes]

        def products() -> None:
            for x, w in zip(xs, ws):
                torch._int_mm(x, w.t())

        return products, flops
    dtype = DTYPES[precision]
    xs = [torch.randn(m, k, generator=g).to(device, dtype) for k, _ in shapes]
    ws = [torch.randn(n, k, generator=g).to(device, dtype) for k, n in shapes]

    def products() -> None:
        for x, w in zip(xs, ws):
            F.linear(x, w)

    return products, flops
