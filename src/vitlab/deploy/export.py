"""Exporting a model for runtimes without vitlab: ONNX (checked in onnxruntime) and torch.export.

Both trace the plain inference forward (`model(x)` -> logits) with the batch axis left
dynamic. The image size is fixed at the model's own: at that size the position embedding is
added as stored, so no resampling (§3.2) enters the graph. For another size, load the
checkpoint with `image_size=...` first; the resampled table is then baked into the export.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from vitlab.files import atomic_write
from vitlab.models.vit import VisionTransformer


def _example(model: nn.Module, batch: int = 2) -> Tensor:
    # Batch 2, not 1: the exporters would take a size-1 axis for a constant.
    cfg = model.config
    return torch.randn(batch, cfg.in_channels, *cfg.image_size)


def export_program(model: VisionTransformer, path: Optional[str | os.PathLike] = None):
    """`torch.export` the inference forward with a dynamic batch; save a .pt2 if `path` is given."""
    from torch.export import Dim

    model = model.eval()
    batch = Dim("batch", min=1, max=4096)
    program = torch.export.export(model, (_example(model),), dynamic_shapes=({0: batch},))
    if path is not None:
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        atomic_write(path, lambda tmp: Path(tmp).write_bytes(buffer.getvalue()))
    return program


def export_onnx(model: VisionTransformer, path: str | os.PathLike, opset: int = 18) -> Path:
    """Write `model` as ONNX with a dynamic batch axis (input "images", output "logits")."""
    model = model.eval()
    program = export_program(model)
    onnx_program = torch.onnx.export(
        program,
        (_example(model),),
        input_names=["images"],
        output_names=["logits"],
        opset_version=opset,
        dynamo=True,
        optimize=True,
        verbose=False,
    )
    atomic_write(path, lambda tmp: onnx_program.save(tmp))
    return Path(path)


@torch.inference_mode()
def check_onnx(path: str | os.PathLike, model: nn.Module, batch_sizes: tuple[int, ...] = (1, 3)) -> float:
    """Run the ONNX file in onnxruntime; return the largest |logit| difference to `model`.

    Batch sizes other than the traced one (2) prove the batch axis really is dynamic.
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    worst = 0.0
    for b in batch_sizes:
        x = _example(model, b)
        ours = model(x).float().numpy()
        theirs = session.run(None, {name: x.numpy()})[0]
        if theirs.shape != ours.shape:
            raise RuntimeError(f"onnxruntime returned shape {theirs.shape} for batch {b}, expected {ours.shape}")
        worst = max(worst, float(abs(theirs - ours).max()))
    return worst


@torch.inference_mode()
def check_program(path: str | os.PathLike, model: nn.Module, batch_sizes: tuple[int, ...] = (1, 3)) -> float:
    """Load a saved .pt2 and return its largest |logit| difference to `model`."""
    program = torch.export.load(str(path)).module()
    worst = 0.0
    for b in batch_sizes:
        x = _example(model, b)
        worst = max(worst, float((program(x) - model(x)).abs().max()))
    return worst
