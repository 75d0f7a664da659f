"""Reduced-precision inference copies of a model, and what they cost in accuracy.

Every function here takes a trained `VisionTransformer` and returns a *copy* prepared for
inference; the original model is never changed. The modes:

- `to_bfloat16(model)`: weights and activations in bfloat16. On CPUs with AVX512-BF16 or AMX
  the matrix products (over 85% of a ViT's time, paper §3.1 Eq. 2-3 are all Dense layers)
  run 2-5x faster than fp32, and, unlike autocast, the weights are not re-cast on every call.
  The Dense layers are also packed once for oneDNN, with the MLP's GELU fused in
  (`PackedLinear`).
- `to_packed_fp32(model)`: the same packing in fp32: the same numbers to float32 rounding.
- `quantize_int8(model)`: the encoder's Dense layers (qkv, attention output, MLP) with int8
  weights (one scale per output channel) and int8 activations (one scale per token, chosen at
  run time), multiplied by `torch._int_mm`. PyTorch's own `quantize_dynamic` is deprecated
  in torch 2.14 (it warns and points to torchao, not a vitlab dependency), so vitlab carries
  this small layer instead.

`agreement(reference, candidate, images)` measures what either mode costs in accuracy: the
fraction of images whose top-1 class is unchanged, and the largest logit difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.checkpoints import io
from vitlab.config import ConfigError, ViTConfig
from vitlab.deploy import kernels
from vitlab.deploy.int8 import calibrated_skeleton, quantize_calibrated, rest_dtype, restore_calibrated
from vitlab.deploy.onednn import onednn_dtypes
from vitlab.models import Model
from vitlab.models.vit import VisionTransformer

CALIBRATED = "int8, calibrated"  # the serving kind of quantize_int8(model, calibration=images)
REST_KEY = "int8_rest_dtype"  # a calibrated copy's file: the dtype of its layers outside the int8 products


class Serving(nn.Module):
    """Every inference copy's one type: the copy (`model`, a ViT whose layers may be packed or
    int8) behind an fp32 interface, casting the images in to `dtype` and the logits out; `serving`
    names its kind, which vitlab.save and export refuse by name."""

    def __init__(self, model: nn.Module, dtype: torch.dtype, kind: str = ""):
        super().__init__()
        self.model: Any = model  # a vitlab model: its forward, features and head
        self.dtype = dtype
        self.serving = kind or str(dtype).removeprefix("torch.")  # what vitlab.save and export refuse by name

    @property
    def config(self):
        return self.model.config

    @property
    def class_names(self):
        return getattr(self.model, "class_names", None)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x.to(self.dtype)).float()

    # The model's feature API (timm's names), through the same casts: eval.features reads a
    # copy's pre-logits as it reads the model's.
    def forward_features(self, x: Tensor) -> Tensor:
        return self.model.forward_features(x.to(self.dtype))

    def forward_head(self, feats: Tensor, pre_logits: bool = False) -> Tensor:
        return self.model.forward_head(feats, pre_logits=pre_logits).float()


class PackedLinear(nn.Module):
    """A Dense layer whose weight is packed once into oneDNN's blocked layout.

    `F.linear` on CPU re-lays the weight out for the matrix unit on every call; for a bf16
    ViT at batch 1 that reorder costs as much as the product itself. Packing once removes
    it. `activation="gelu_tanh"|"gelu"` fuses the MLP's GELU into the product's output
    (Eq. 3's MLP is Dense -> GELU -> Dense), saving a pass over the (B, T, mlp) activations;
    PyTorch's own tanh GELU kernel is several times slower than the fused one.
    """

    def __init__(self, linear: nn.Linear, activation: str = "none", batch_hint: Optional[int] = None):
        super().__init__()
        w = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.activation = activation
        # Not persistent: a packed layout is for this process and machine, not for a file.
        self.register_buffer("weight_packed", torch.ops.mkldnn._reorder_linear_weight(w, batch_hint), persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self._post = {"none": ("none", ""), "gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh")}[activation]

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight_packed, self.bias, self._post[0], [], self._post[1])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN, activation={self.activation}"


def pack_linears(model: VisionTransformer, batch_hint: Optional[int] = None, measured: bool = False) -> VisionTransformer:
    """Replace the encoder's Dense layers (in their current dtype) by `PackedLinear`, with the
    MLP's GELU fused into its first layer. Inference only: packed weights have no gradient.
    `measured`: only the shapes where oneDNN timed faster than `F.linear` on this machine
    (`vitlab.deploy.kernels`); the others keep the model's own layer."""
    dtype = next(model.parameters()).dtype
    tokens = model.config.num_tokens
    for block in model.blocks:
        mlp = block.mlp
        assert mlp.fc1.gelu is not None  # the MLP's first Dense layer carries its GELU
        act = {"tanh": "gelu_tanh", "none": "gelu"}[mlp.fc1.gelu]
        for parent, name, activation in ((block.attn, "qkv", None), (block.attn, "proj", None), (mlp, "fc1", act),
                                         (mlp, "fc2", None)):
            layer = getattr(parent, name)
            if measured and kernels.choose_dense(layer.in_features, layer.out_features, tokens, activation,
                                                 dtype).kernel != "oneDNN":
                continue
            setattr(parent, name, PackedLinear(layer, activation or "none", batch_hint))  # the copy's drop-in for the Dense layer
    return model


def _packable(model: nn.Module, dtype: torch.dtype) -> bool:
    """oneDNN's packed layout is for CPU tensors in a dtype its kernel runs on this CPU (bf16
    needs AVX-512 or AVX-NE-CONVERT); elsewhere, and on a GPU, the copies stay plain."""
    return dtype in onednn_dtypes() and next(model.parameters()).device.type == "cpu"


def attention_kernel(cfg: ViTConfig, dtype: torch.dtype, device: torch.device) -> str:
    """A CPU copy's attention kernel: the fused one or the explicit matmul-softmax path,
    whichever measured faster on this machine at the model's shapes (`vitlab.deploy.kernels`;
    the fused kernel wins in bf16 with AMX and loses without it); the same function either way.
    The fused one on a GPU and in other dtypes."""
    if dtype not in (torch.float32, torch.bfloat16) or device.type != "cpu" or not cfg.depth:
        return "fused"
    return kernels.choose_attention(cfg.num_heads, cfg.num_tokens, cfg.hidden_size // cfg.num_heads, dtype).kernel


def built_copy(model: VisionTransformer, dtype: torch.dtype, attention: Optional[torch.dtype] = None) -> VisionTransformer:
    """A fresh copy of `model` in eval mode in `dtype`, built with the CPU attention kernel
    measured for the dtype its attention runs in (`attention_kernel`; none: the fused one): a
    choice made when the copy is constructed, never a flag set on a model after."""
    device = next(model.parameters()).device
    kernel = attention_kernel(model.config, attention, device) if attention else "fused"
    with torch.random.fork_rng(devices=[]):  # the throwaway initialisation leaves no trace
        m = type(model)(model.config, cpu_attention=kernel)
    m.load_state_dict(model.state_dict())
    m.class_names = model.class_names
    return m.to(device, dtype).eval()


def to_reduced(model: VisionTransformer, dtype: torch.dtype = torch.bfloat16, packed: bool = True, measured: bool = True,
               kind: str = "") -> Serving:
    """A copy of `model` in `dtype` (bf16, fp32, or fp16 for GPUs) for inference: takes fp32
    images, returns fp32 logits. On the CPU, `packed` (the default) also packs the
    encoder's Dense layers once and fuses the GELU (see `PackedLinear`); `measured`: only the
    Dense shapes, and the attention kernel, that timed faster so on this machine
    (`vitlab.deploy.kernels`), else every Dense layer and the fused attention."""
    m = built_copy(model, dtype, attention=dtype if measured else None)
    if packed and dtype != torch.float16 and _packable(m, dtype):  # oneDNN's fp16 wants AVX512-FP16
        with torch.no_grad():
            pack_linears(m, measured=measured)
    return Serving(m, dtype, kind)


def to_bfloat16(model: VisionTransformer, packed: bool = True) -> Serving:
    """A bf16 copy of `model` for inference: takes fp32 images, returns fp32 logits.

    `packed` (default, where oneDNN is available) also packs the encoder's Dense layers once
    and fuses the GELU (see `PackedLinear`).
    """
    return to_reduced(model, torch.bfloat16, packed)


def to_packed_fp32(model: VisionTransformer) -> Serving:
    """An fp32 inference copy with every Dense layer packed for oneDNN and the GELU fused: the
    same numbers as `model` to float32 rounding, without autograd (on a GPU: a plain copy).
    Its packed layout is for this process: vitlab.save refuses it."""
    return to_reduced(model, torch.float32, measured=False, kind="fp32-packed")


def to_measured_fp32(model: VisionTransformer) -> Serving:
    """vitlab's fp32 CPU inference copy: each Dense shape on oneDNN's packed kernel (bias and
    GELU fused) or on the model's own `F.linear`, and the attention on the fused or the explicit
    kernel, whichever timed faster on this machine (`vitlab.deploy.kernels`: measured once,
    cached per machine). The same numbers as `model` to float32 rounding, without autograd; a
    copy for this process and machine, which vitlab.save refuses."""
    return to_reduced(model, torch.float32, kind="fp32-auto")


class Int8Linear(nn.Module):
    """A Dense layer computed in int8: y = (s_x s_w) * (q_x q_w^T) + b.

    Weights are quantised once, symmetric, one scale per output channel; activations are
    quantised per token (row) on every call, so a token with a large outlier does not
    squash the resolution of the others (LayerNorm outputs of ViTs have such outliers).
    The int32 accumulation is exact; the only error is the two roundings to int8.
    """

    weight_int8: Tensor  # buffers (register_buffer), declared for the type checker
    weight_scale: Tensor
    bias: Optional[Tensor]

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()  # (out, in)
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # (out,)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.gelu = getattr(linear, "gelu", None)  # the MLP's first Dense layer carries its GELU
        # Kept as (out, in); `_int_mm` takes its transposed view without a copy.
        self.register_buffer("weight_int8", q)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()  # (M, in)
        x_scale = x2.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0  # (M, 1)
        xq = torch.round(x2 / x_scale).to(torch.int8)
        acc = torch._int_mm(xq, self.weight_int8.t())  # (M, out), int32, exact
        y = acc.float().mul_(x_scale).mul_(self.weight_scale)
        if self.bias is not None:
            y.add_(self.bias)
        if self.gelu is not None:
            y = F.gelu(y, approximate=self.gelu)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def _int8_layers(model: VisionTransformer) -> VisionTransformer:
    """`model` (a copy) with its encoder's Dense layers as `Int8Linear`, in place."""
    for block in model.blocks:
        for parent, name in ((block.attn, "qkv"), (block.attn, "proj"), (block.mlp, "fc1"), (block.mlp, "fc2")):
            setattr(parent, name, Int8Linear(getattr(parent, name)))
    return model


def quantize_int8(model: VisionTransformer, calibration: Optional[Tensor] = None) -> Serving:
    """An inference copy of `model` whose encoder Dense layers run in int8.

    With `calibration` images (normalised as the model expects; a few hundred training
    images): static scales, smoothed LayerNorm outliers and oneDNN's int8 kernels, bf16
    elsewhere where this CPU has it, else fp32 (`vitlab.deploy.int8`): the fast mode on x86
    CPUs with VNNI or AMX. Without: `Int8Linear` (scales per token at run time,
    `torch._int_mm`), which runs anywhere; the patch embedding, position embedding,
    LayerNorms, softmax and the head then stay fp32.
    """
    if calibration is not None:
        calibrated = quantize_calibrated(built_copy(model, torch.float32, attention=rest_dtype()), calibration)
        return Serving(calibrated, rest_dtype(), kind=CALIBRATED)
    # saved by save_int8, not vitlab.save (its tensors are not a ViT's)
    return Serving(_int8_layers(built_copy(model, torch.float32)), torch.float32, "int8")


def save_int8(model: nn.Module, path) -> None:
    """Write an int8 copy (`quantize_int8`, with or without calibration) as a vitlab
    .safetensors file whose metadata says so: the int8 weights with their scales (and, when
    calibrated, the activations' static scales and the smoothed LayerNorms), the rest as the
    copy keeps it. `load_int8` reads it back; `vitlab.load` refuses it by name."""
    kind = getattr(model, "serving", "")
    if not isinstance(model, Serving) or kind not in ("int8", CALIBRATED):
        raise ValueError("save_int8 takes an int8 copy: vitlab.deploy.quantize_int8(model) makes one")
    inner: Any = model.model  # the ViT inside the copy
    extra = {io.SERVING_KEY: kind, **({REST_KEY: str(model.dtype).removeprefix("torch.")} if kind == CALIBRATED else {})}
    io.write_state(inner.config, inner.state_dict(), inner.class_names, path, extra_metadata=extra)


def load_int8(path) -> Serving:
    """The int8 copy `save_int8` wrote, ready to run: the portable one (which torch.export
    takes) or a calibrated one (the same logits as when it was saved, on a CPU that runs it)."""
    kind = io.read_metadata(path).get(io.SERVING_KEY, "int8")
    imported = io.read(path, serving=kind)
    rest = getattr(torch, imported.metadata.get(REST_KEY, "float32"), torch.float32)
    try:  # a copy this CPU cannot run (calibrated_skeleton, restore_calibrated) is refused naming the file
        with torch.random.fork_rng(devices=[]):  # the throwaway initialisation leaves no trace
            if not isinstance(imported.config, ViTConfig):
                raise io.CheckpointError(f"an int8 copy stores a ViT, not a {imported.config.kind} model")
            if kind == CALIBRATED:
                cpu = torch.device("cpu")
                fresh = VisionTransformer(imported.config, cpu_attention=attention_kernel(imported.config, rest, cpu))
                model = calibrated_skeleton(fresh, rest)
            else:
                model = _int8_layers(VisionTransformer(imported.config).eval())
        try:
            model.load_state_dict(imported.state, strict=True)
        except RuntimeError as e:  # keys or shapes that the stored config's int8 model does not have
            raise io.CheckpointError(f"the stored config does not fit the int8 tensors: {' '.join(str(e).split())[:400]}",
                                     reason="config-mismatch") from None
        model.class_names = imported.class_names
        if kind == CALIBRATED:
            return Serving(restore_calibrated(model, rest), rest, kind=CALIBRATED)
        return Serving(model, torch.float32, "int8")
    except io.CheckpointError as e:
        raise io.CheckpointError(f"{path}: {e}", reason=e.reason) from None


@dataclass
class Agreement:
    top1: float  # fraction of images with the same predicted class
    max_abs_diff: float  # largest logit difference
    count: int

    def __str__(self) -> str:
        return f"top-1 agreement {self.top1:.2%} on {self.count:,} images, max |logit diff| {self.max_abs_diff:.3g}"


@torch.inference_mode()
def agreement(reference: nn.Module, candidate: nn.Module, images: Tensor, batch_size: int = 256) -> Agreement:
    """How often `candidate` predicts the same class as `reference` on `images` (N, C, H, W)."""
    same, diff = 0, 0.0
    for i in range(0, len(images), batch_size):
        x = images[i : i + batch_size]
        ref, out = reference(x).float(), candidate(x).float()
        same += int((ref.argmax(-1) == out.argmax(-1)).sum())
        diff = max(diff, float((ref - out).abs().max()))
    return Agreement(same / max(len(images), 1), diff, len(images))


PRECISIONS = ("fp32", "fp32-packed", "bf16", "fp16", "int8")


def for_precision(model: Model, precision: str, calibration: Optional[Tensor] = None) -> nn.Module:
    """The inference copy of `model` for a precision name ("fp32" returns the model itself);
    `calibration` images are for int8 (see `quantize_int8`)."""
    if precision == "fp32":
        return model.eval()
    if not isinstance(model, VisionTransformer):
        raise ConfigError(f"{precision} serving copies pack a ViT's encoder blocks; {model.config.name} has none: "
                          "run it in fp32 (vitlab bench also times it under bf16 autocast)")
    # fp32-auto: what inference_copy(model) gives on a CPU (vitlab bench's row of it)
    copies: dict[str, Callable[[VisionTransformer], nn.Module]] = {
        "fp32-packed": to_packed_fp32, "fp32-auto": to_measured_fp32, "bf16": to_bfloat16,
        "fp16": lambda m: to_reduced(m, torch.float16), "int8": lambda m: quantize_int8(m, calibration)}
    if precision not in copies:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return copies[precision](model)


def inference_copy(model: Model, precision: str = "fp32", *, plain: bool = False,
                   calibration: Optional[Tensor] = None) -> nn.Module:
    """The model as vitlab runs it for inference, built once, before any forward: the one call
    for a user's own loop. On a CPU, "fp32" is `to_measured_fp32`: each Dense shape and the
    attention on the kernel that timed fastest on this machine (oneDNN's packed weights with
    bias and GELU fused, or `F.linear`; cached per machine), the same function to float32
    rounding; "fp32-packed" packs every Dense layer for oneDNN whatever it measured; the other
    precisions are `for_precision`'s copies. `plain=True` (the command line's --plain) returns
    the model itself in eval mode, as PyTorch runs it. On a GPU, and for a model without
    encoder blocks (a BiT ResNet), fp32 is the model itself."""
    model = model.eval()
    if plain:
        if precision != "fp32":
            raise ConfigError(f"plain runs the model as it is, in fp32; drop plain (--plain) to run {precision}")
        return model
    on_cpu = next(model.parameters()).device.type == "cpu"
    if precision == "fp32" and on_cpu and isinstance(model, VisionTransformer):
        return to_measured_fp32(model)
    return for_precision(model, precision, calibration)
