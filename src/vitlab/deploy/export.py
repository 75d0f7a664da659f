"""Exporting a model for runtimes without vitlab: ONNX (checked in onnxruntime) and torch.export.

Both trace the plain inference forward (`model(x)` -> logits) with the batch axis left
dynamic. The image size is fixed at the model's own: at that size the position embedding is
added as stored, so no resampling (§3.2) enters the graph. For another size, load the
checkpoint with `image_size=...` first; the resampled table is then baked into the export.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor, nn

from vitlab.config.preprocessing import config_recipe, recipe_sentence
from vitlab.extras import require
from vitlab.files import atomic_write
from vitlab.models.vit import VisionTransformer


def _example(model: nn.Module, batch: int = 2) -> Tensor:
    # Batch 2, not 1: the exporters would take a size-1 axis for a constant.
    cfg: Any = model.config  # a vitlab model's, or an inference copy's (deploy.Serving)
    device = next((t.device for t in [*model.parameters(), *model.buffers()]), torch.device("cpu"))
    return torch.randn(batch, cfg.in_channels, *cfg.image_size).to(device)  # on the model's device (--device)


def export_program(model: VisionTransformer, path: Optional[str | os.PathLike] = None):
    """`torch.export` the inference forward with a dynamic batch; save a .pt2 if `path` is given."""
    from torch.export import Dim

    refuse_serving_copy(model, "torch.export")
    model = model.eval()
    batch = Dim("batch", min=1, max=4096)
    program = torch.export.export(model, (_example(model),), dynamic_shapes=({0: batch},))
    if path is not None:
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        atomic_write(path, lambda tmp: Path(tmp).write_bytes(buffer.getvalue()))
    return program


def onnx_metadata(model: VisionTransformer) -> dict[str, str]:
    """What a runtime needs beside the graph, as ONNX metadata_props (strings; lists as JSON):
    the class names, and the preprocessing the model expects (vitlab.transform's) both as one
    key per number (config.preprocessing's `eval_recipe`) and as `vitlab.preprocessing`, the sentence made
    from those keys."""
    cfg = model.config
    names = getattr(model, "class_names", None) or [str(i) for i in range(cfg.num_classes)]
    steps = config_recipe(cfg)  # what vitlab.transform(model) runs (data/transforms.py's EvalTransform)
    recipe = {f"vitlab.{k}": v if isinstance(v, str) else json.dumps(v) for k, v in steps.items()}
    return {"vitlab.model": cfg.name, "vitlab.class_names": json.dumps(list(names)), **recipe, "vitlab.preprocessing": recipe_sentence(steps),
            "vitlab.output": "logits (batch, classes); softmax gives the class probabilities", "vitlab.config": cfg.to_json()}


def refuse_serving_copy(model: nn.Module, what: str) -> None:
    """A reduced-precision serving copy has no ONNX form vitlab can promise, and a copy with
    oneDNN-packed weights (vitlab.deploy.inference_copy's) none at all: say what to do."""
    kind = getattr(model, "serving", "")
    if kind and what == "torch.export":
        if kind == "int8":  # the portable int8 layer (torch._int_mm) exports as it is
            return
        raise ValueError(f"{what} of an inference copy ({kind}) is not supported (its packed weights are this process's): "
                         "export the model itself")
    if kind:
        raise ValueError(f"{what} of a serving copy ({kind}) is not supported: export the fp32 model (and quantise it in the "
                         "runtime), or this copy with torch.export (--format torch-export)")


def export_onnx(model: VisionTransformer, path: str | os.PathLike, opset: int = 18) -> Path:
    """Write `model` as ONNX with a dynamic batch axis (input "images", output "logits"),
    the class names and preprocessing in the file's metadata_props (`onnx_metadata`)."""
    refuse_serving_copy(model, "ONNX export")
    model = model.eval()
    program = export_program(model)
    onnx_program = torch.onnx.export(program, (_example(model),), input_names=["images"], output_names=["logits"], opset_version=opset, dynamo=True,
                                     optimize=True, verbose=False)
    assert onnx_program is not None  # None only when the exporter is given a file name (f=)
    name_batch_axis(onnx_program.model)
    onnx_program.model.metadata_props.update(onnx_metadata(model))
    atomic_write(path, lambda tmp: onnx_program.save(tmp))
    return Path(path)


def name_batch_axis(onnx_model) -> None:
    """Call the dynamic batch axis "batch" wherever it appears. The exporter names it after
    torch's internal symbol ("s77"), which a runtime shows to the user as the input's shape."""
    import onnx_ir as ir

    symbol = onnx_model.graph.inputs[0].shape[0]
    if not isinstance(symbol, ir.SymbolicDim):
        return
    values = [*onnx_model.graph.inputs, *onnx_model.graph.outputs]
    values += [v for node in ir.traversal.RecursiveGraphIterator(onnx_model.graph) for v in node.outputs]
    for v in values:
        if v.shape is not None and any(isinstance(d, ir.SymbolicDim) and d.value == symbol.value for d in v.shape):
            v.shape = ir.Shape(["batch" if isinstance(d, ir.SymbolicDim) and d.value == symbol.value else d
                                for d in v.shape])


def read_onnx_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The metadata_props of an ONNX file, as onnxruntime reads them."""
    ort = require("export", "reading an ONNX file", modules=("onnxruntime",))["onnxruntime"]

    return dict(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_modelmeta().custom_metadata_map)


def check_onnx(path: str | os.PathLike, model: nn.Module, batch_sizes: tuple[int, ...] = (1, 3)) -> float:
    """Run the ONNX file in onnxruntime; return the largest |logit| difference to `model`.
    Batch sizes other than the traced one (2) prove the batch axis really is dynamic.
    """
    ort = require("export", "checking the ONNX file", modules=("onnxruntime",))["onnxruntime"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return _worst(lambda x: torch.from_numpy(session.run(None, {name: x.cpu().numpy()})[0]), model, batch_sizes, "onnxruntime")


def check_program(path: str | os.PathLike, model: nn.Module, batch_sizes: tuple[int, ...] = (1, 3)) -> float:
    """Load a saved .pt2 and return its largest |logit| difference to `model`."""
    program = torch.export.load(str(path)).module()
    return _worst(lambda x: program(x), model, batch_sizes, "the exported program")


@torch.inference_mode()
def _worst(run, model: nn.Module, batch_sizes: tuple[int, ...], runtime: str) -> float:
    """The largest |logit| difference between `run(x)` and `model(x)` over the batch sizes."""
    worst = 0.0
    for b in batch_sizes:
        x = _example(model, b)
        ours, theirs = model(x).float().cpu(), run(x).float().cpu()
        if theirs.shape != ours.shape:
            raise RuntimeError(f"{runtime} returned shape {tuple(theirs.shape)} for batch {b}, expected {tuple(ours.shape)}")
        worst = max(worst, float((theirs - ours).abs().max()))
    return worst
