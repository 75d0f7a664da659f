"""Deployment on CPUs: reduced-precision serving copies, export, and the benchmark suite.

    from vitlab import deploy
    fast = deploy.to_bfloat16(model)            # or deploy.quantize_int8(model)
    print(deploy.agreement(model, fast, images))
    deploy.save_int8(deploy.quantize_int8(model), "q8.safetensors"); deploy.load_int8("q8.safetensors")
    deploy.export_onnx(model, "model.onnx"); deploy.check_onnx("model.onnx", model)   # class names in its metadata

`vitlab.deploy.bench` measures throughput against timm, Hugging Face and torchvision.
"""

from vitlab.deploy.export import check_onnx, check_program, export_onnx, export_program, onnx_metadata, read_onnx_metadata
from vitlab.deploy.serving import (
    PRECISIONS,
    Agreement,
    Int8Linear,
    PackedLinear,
    Serving,
    agreement,
    for_precision,
    load_int8,
    quantize_int8,
    save_int8,
    to_bfloat16,
    to_packed_fp32,
)

__all__ = [
    "PRECISIONS",
    "Agreement",
    "Int8Linear",
    "PackedLinear",
    "Serving",
    "agreement",
    "check_onnx",
    "check_program",
    "export_onnx",
    "export_program",
    "for_precision",
    "load_int8",
    "onnx_metadata",
    "quantize_int8",
    "read_onnx_metadata",
    "save_int8",
    "to_bfloat16",
    "to_packed_fp32",
]
