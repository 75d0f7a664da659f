"""What a checkpoint holds, for `vitlab info`: the format, the config, the parameter count,
the class names, and for a serving copy (vitlab.deploy.save_int8) what kind it is and how
to run it. A serving copy is described, not refused: reading it as a plain model is what
`vitlab.load` refuses, not looking at it."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Optional

from vitlab.checkpoints import io, read_checkpoint
from vitlab.config import model_flops


def describe(path_or_name: str | os.PathLike, format: Optional[str] = None) -> dict[str, Any]:
    """A JSON-ready description of a checkpoint file, folder or published name."""
    header = io.detect(Path(path_or_name)) if format in (None, "vitlab") else None  # read once, for both
    kind = (header or {}).get(io.SERVING_KEY, "")  # "int8" for a serving copy's file
    if kind:
        imported = io.read(path_or_name, serving=kind, meta=header)
        imported.source_format = "vitlab"
        # The int8 weights are integers with float scales beside them: count the parameters
        # of the model they stand for, not the tensors that store it.
        params = sum(math.prod(s) for s in io.expected_shapes(imported.config).values())
    else:
        imported = read_checkpoint(path_or_name, format)
        params = sum(t.numel() for t in imported.state.values() if t.is_floating_point())
    cfg = imported.config
    info = {"path": str(path_or_name), "format": imported.source_format, "serving": kind or None, "params": params,
            "gflops": model_flops(cfg) / 1e9, "config": cfg.to_dict(), "class_names": imported.class_names,
            "guessed": imported.guessed}  # guessed: field -> where its value came from (the file lacks it)
    if kind:
        info["int8_tensors"] = sum(1 for t in imported.state.values() if t.dtype.is_signed and not t.is_floating_point()
                                   and t.element_size() == 1)
        info["file_bytes"] = Path(path_or_name).stat().st_size
    return info


def serving_line(info: dict[str, Any]) -> Optional[str]:
    """How to run a serving copy, or None for a plain checkpoint."""
    if not info.get("serving"):
        return None
    # A calibrated copy runs oneDNN's int8 kernels on packed weights, which no exporter holds.
    export = " (oneDNN's int8 kernels; no export)" if "calibrated" in info["serving"] else \
        " or `vitlab export --format torch-export`"
    return (f"{info['serving']} serving copy ({info['int8_tensors']} int8 weight tensors, "
            f"{info['file_bytes'] / 1e6:.1f} MB): run it with vitlab.deploy.load_int8(path){export}; "
            "vitlab.load reads only the fp32 model it was made from")
