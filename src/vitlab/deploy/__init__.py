"""Deployment on CPUs: reduced-precision serving copies and export.

    from vitlab import deploy
    fast = deploy.to_bfloat16(model)            # or deploy.quantize_int8(model, calibration=images)
    print(deploy.agreement(model, fast, images))
    deploy.export_onnx(model, "model.onnx"); deploy.check_onnx("model.onnx", model)

Throughput against timm, Hugging Face and torchvision is measured by `vitlab.bench`.
"""

from vitlab.deploy.export import check_onnx, check_program, export_onnx, export_program
from vitlab.deploy.int8 import CalibratedInt8Linear
from vitlab.deploy.serving import (
    PRECISIONS,
    Agreement,
    Int8Linear,
    PackedLinear,
    Serving,
    agreement,
    for_precision,
    quantize_int8,
    to_bfloat16,
    to_packed_fp32,
)

__all__ = [
    "PRECISIONS",
    "Agreement",
    "CalibratedInt8Linear",
    "Int8Linear",
    "PackedLinear",
    "Serving",
    "agreement",
    "check_onnx",
    "check_program",
    "export_onnx",
    "export_program",
    "for_precision",
    "quantize_int8",
    "to_bfloat16",
    "to_packed_fp32",
]
