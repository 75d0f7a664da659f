"""What oneDNN runs on this CPU, asked once, when an inference copy is built.

The model (`vitlab.models`) computes with PyTorch's public ops only; the kernel choices of
the fast CPU path (packed weights, fused bias and GELU, bf16 and int8 products) are made
here and in `copies.py`, when a copy is built, never inside a traced or compiled forward.
"""

from __future__ import annotations

import functools

import torch


def refuse_inside_a_trace(what: str) -> None:
    """A probe run inside torch.export, ONNX export, jit tracing or torch.compile would be
    recorded into the graph and its answer cached for the whole process: refuse it instead."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.compiler.is_exporting():
        raise RuntimeError(f"{what} is built outside a trace: build the inference copy first, "
                           "and export or compile the plain model (vitlab.create_model, vitlab.load)")


@functools.cache
def _probe() -> frozenset[torch.dtype]:
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return frozenset()
    runs = set()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        w, x = torch.zeros(8, 8, dtype=dtype), torch.zeros(2, 8, dtype=dtype)
        try:
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
            torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, 2), None, "none", [], "")
        except RuntimeError:
            continue
        runs.add(dtype)
    return frozenset(runs)


def onednn_dtypes() -> frozenset[torch.dtype]:
    """The dtypes oneDNN's Dense kernel runs on this CPU, found by running it once on a tiny
    product. fp32 runs everywhere; bf16 and fp16 need AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT,
    and an AVX2-only CPU (or ONEDNN_MAX_CPU_ISA=AVX2) refuses them with an error at the call.
    Asking the kernel is exact for every CPU and PyTorch build, where a list of CPU flags would
    go stale. Never asked inside a trace (see `refuse_inside_a_trace`)."""
    refuse_inside_a_trace("the oneDNN capability probe")
    return _probe()
