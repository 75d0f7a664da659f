"""Deployment on CPUs: reduced-precision serving copies and export.

    from vitlab import deploy
    fast = deploy.inference_copy(model)         # vitlab's CPU inference path: fp32, kernels timed on this machine
    fast = deploy.to_bfloat16(model)            # or deploy.quantize_int8(model, calibration=images)
    print(deploy.agreement(model, fast, images))
    deploy.save_int8(deploy.quantize_int8(model), "q8.safetensors"); deploy.load_int8("q8.safetensors")
    deploy.export_onnx(model, "model.onnx"); deploy.check_onnx("model.onnx", model)   # class names in its metadata

Throughput against timm, Hugging Face and torchvision is measured by `vitlab.bench`.
"""

from vitlab.deploy.copies import (
    PRECISIONS,
    Agreement,
    Int8Linear,
    PackedLinear,
    Serving,
    agreement,
    for_precision,
    inference_copy,
    load_int8,
    quantize_int8,
    save_int8,
    to_bfloat16,
    to_measured_fp32,
    to_packed_fp32,
)
from vitlab.deploy.export import check_onnx, check_program, export_onnx, export_program, onnx_metadata, read_onnx_metadata
from vitlab.deploy.int8 import CalibratedInt8Linear
from vitlab.deploy.onednn import onednn_dtypes

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
    "inference_copy",
    "load_int8",
    "onednn_dtypes",
    "onnx_metadata",
    "quantize_int8",
    "read_onnx_metadata",
    "save_int8",
    "to_bfloat16",
    "to_measured_fp32",
    "to_packed_fp32",
]
