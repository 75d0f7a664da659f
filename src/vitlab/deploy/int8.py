"""int8 serving on oneDNN's u8 x s8 kernels (AVX512-VNNI, AMX-int8), calibrated on images.

`quantize_calibrated(copy, images)` makes a copy (`copies.quantize_int8` builds it) one whose encoder Dense layers (paper §3.1,
Eq. 2-3: qkv, the attention projection, the MLP's two layers) multiply int8 numbers with
int32 accumulation, and whose other parts (LayerNorm, attention's softmax, the residual
stream) run in `rest_dtype()`: bf16 where oneDNN runs bf16 on this CPU, fp32 elsewhere. Three
choices make it fast and keep it accurate:

- **Static activation scales.** Each Dense layer's input range is measured once on the
  calibration images, so no call spends a pass over its input finding the range; the MLP's
  first layer writes its GELU output directly as uint8 for the second.
- **Smoothing (SmoothQuant, Xiao et al. 2023).** A ViT's LayerNorm outputs have a few
  channels with large values; one scale for the whole tensor would spend its 256 levels on
  them. Dividing channel j by s_j = a_j^0.5 / w_j^0.5 (a_j: the activation's largest |value|,
  w_j: the weight column's) and multiplying the weight column by s_j computes the same
  function in exact arithmetic; the division is folded into the LayerNorm's affine weights,
  so it costs nothing at run time.
- **Per-channel weight scales**, symmetric int8, one scale per output channel.

On CPUs without VNNI (AVX2 only), oneDNN multiplies u8 x s8 with an instruction that adds
each pair of products into a saturating int16, so two products near 255 x 127 overflow and
the result is wrong, silently (measured: errors of 6e4 on random full-range operands). Where
a one-time probe finds that, activations use 7 bits (0..127), whose pairs fit int16 exactly;
it costs one bit of activation resolution there and nothing elsewhere. Those CPUs have no
bf16 either, and oneDNN's int8 kernel writing bf16 output there falls back to a reference
loop (measured on an AVX2 EPYC: 0.45 s for a 520x64x256 product, against 0.6 ms writing
uint8 and 6-10 ms writing fp32), so the copy keeps its other parts in fp32 there.

`vitlab.deploy.copies.quantize_int8` without calibration images keeps the portable layer
(`torch._int_mm`, scales found per token at run time); this one needs oneDNN's kernels
(`torch.ops.onednn.qlinear_pointwise`, on x86 PyTorch builds).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch
from torch import Tensor, nn

from vitlab.checkpoints.io import CheckpointError
from vitlab.config import ConfigError
from vitlab.deploy.onednn import onednn_dtypes
from vitlab.models.layers import Block, Dense
from vitlab.models.vit import VisionTransformer

ALPHA = 0.5  # SmoothQuant's migration strength: half of the outliers' range moves to the weights


def available() -> bool:
    return hasattr(torch.ops, "onednn") and hasattr(torch.ops.onednn, "qlinear_pointwise")


def rest_dtype() -> torch.dtype:
    """The dtype of the calibrated copy outside its int8 products: bf16 where oneDNN runs it
    on this CPU (AVX-512, AMX), else fp32 (see the module's notes on AVX2-only CPUs)."""
    return torch.bfloat16 if torch.bfloat16 in onednn_dtypes() else torch.float32


@functools.cache
def activation_top() -> int:
    """The largest uint8 activation level the int8 kernel multiplies exactly on this CPU: 255,
    or 127 where its u8 x s8 pairs saturate int16 (no VNNI; see the module's notes). Found by
    one product whose exact value is known: 8 x 255 x 127."""
    x, w = torch.full((1, 8), 255, dtype=torch.uint8), torch.full((1, 8), 127, dtype=torch.int8)
    y = torch.ops.onednn.qlinear_pointwise(
        x, 1.0, 0, torch.ops.onednn.qlinear_prepack(w, None), torch.ones(1), torch.zeros(1, dtype=torch.int64),
        None, 1.0, 0, torch.float32, "none", [], "")
    return 255 if float(y) == 8 * 255 * 127 else 127


def affine_u8(lo: float, hi: float, top: int = 255) -> tuple[float, int]:
    """Scale and zero point mapping [lo, hi] (widened to hold 0) onto 0..top."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max(hi - lo, 1e-8) / top
    return scale, int(min(max(round(-lo / scale), 0), top))


class CalibratedInt8Linear(nn.Module):
    """y = s_x s_w (q_x - z_x) q_w^T + b, with q_x uint8 (a static scale and zero point),
    q_w int8 (a scale per output channel), on oneDNN; GELU fused where the Dense layer had
    one. Output in `out_dtype`, or uint8 at `out_range` (the next layer's input)."""

    quantisation: Tensor  # buffers (register_buffer), declared for the type checker
    weight_int8: Tensor
    weight_packed: Tensor

    def __init__(self, linear: Dense, x_range: tuple[float, float],
                 out_range: Optional[tuple[float, float]] = None, out_dtype: Optional[torch.dtype] = None):
        super().__init__()
        w = linear.weight.detach().float()  # (out, in)
        w_scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(w / w_scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.top = activation_top()  # the uint8 levels used: 0..255, or 0..127 without VNNI
        self.x_scale, self.x_zero = affine_u8(*x_range, self.top)
        self.out_scale, self.out_zero = affine_u8(*out_range, self.top) if out_range else (1.0, 0)
        self.out_dtype = None if out_range else (out_dtype or rest_dtype())  # None: oneDNN writes uint8
        gelu = getattr(linear, "gelu", None)
        self.post: tuple[str, list[Any], str] = ("none", [], "") if gelu is None else ("gelu", [], gelu)
        # The int8 weight and the activation's quantisation travel in a file (deploy.save_int8);
        # the packed layout is for this process and machine only, made again by `restore`.
        self.register_buffer("weight_int8", q)
        self.register_buffer("weight_scale", w_scale)
        self.register_buffer("weight_zero", torch.zeros(len(w_scale), dtype=torch.int64))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.register_buffer("quantisation", torch.tensor(
            [self.x_scale, self.x_zero, self.out_scale, self.out_zero, self.top, out_range is not None], dtype=torch.float64))
        self.register_buffer("weight_packed", torch.ops.onednn.qlinear_prepack(q, None), persistent=False)

    def restore(self, out_dtype: torch.dtype) -> None:
        """After load_state_dict: the scales and zero points from `quantisation`, the weight
        packed again. Refused where this CPU's int8 kernel cannot multiply the stored levels."""
        x_scale, x_zero, out_scale, out_zero, top, uint8_out = self.quantisation.tolist()
        if top > activation_top():
            raise CheckpointError("this int8 copy was calibrated for 8-bit activations, which this CPU's int8 kernel (no VNNI) "
                                  "multiplies wrongly: calibrate it again here (deploy.quantize_int8)")
        self.x_scale, self.x_zero, self.top = x_scale, int(x_zero), int(top)
        self.out_scale, self.out_zero = out_scale, int(out_zero)
        self.out_dtype = None if uint8_out else out_dtype
        self.weight_packed = torch.ops.onednn.qlinear_prepack(self.weight_int8, None)

    def quantize(self, x: Tensor) -> Tensor:
        # In fp32 (bf16 cannot hold 0..255 in unit steps), on a copy: x is not ours to change.
        return x.to(torch.float32, copy=True).mul_(1.0 / self.x_scale).add_(self.x_zero).round_().clamp_(0, self.top).to(torch.uint8)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        q = x if x.dtype == torch.uint8 else self.quantize(x)
        y = torch.ops.onednn.qlinear_pointwise(
            q.reshape(-1, shape[-1]), self.x_scale, self.x_zero, self.weight_packed, self.weight_scale,
            self.weight_zero, self.bias, self.out_scale, self.out_zero, self.out_dtype, *self.post)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        out = "uint8" if self.out_dtype is None else str(self.out_dtype).replace("torch.", "")
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 (oneDNN), out {out}"


def _dense_layers(block: Block) -> dict[str, Dense]:
    return {"qkv": block.attn.qkv, "proj": block.attn.proj, "fc1": block.mlp.fc1, "fc2": block.mlp.fc2}


@torch.no_grad()
def channel_ranges(model: VisionTransformer, images: Tensor, batch_size: int = 64) -> dict[nn.Module, Tensor]:
    """Each encoder Dense layer's input: per-channel (min, max) over the images, (2, in).
    Forward pre-hooks, removed before returning; the model is run in eval mode, fp32."""
    ranges: dict[nn.Module, Tensor] = {}

    def observe(layer: nn.Module, args: tuple) -> None:
        x = args[0].detach().float().reshape(-1, args[0].shape[-1])
        seen = torch.stack([x.amin(0), x.amax(0)])
        old = ranges.get(layer)
        ranges[layer] = seen if old is None else torch.stack([torch.minimum(old[0], seen[0]), torch.maximum(old[1], seen[1])])

    layers = [d for block in model.blocks for d in _dense_layers(block).values()]
    handles = [d.register_forward_pre_hook(observe) for d in layers]
    try:
        model.eval()
        for i in range(0, len(images), batch_size):
            model(images[i : i + batch_size].float())
    finally:
        for h in handles:
            h.remove()
    return ranges


@torch.no_grad()
def smooth(norm: nn.LayerNorm, dense: Dense, x_range: Tensor, alpha: float = ALPHA) -> Tensor:
    """Fold s = a^alpha / w^(1-alpha) into the LayerNorm (divide) and the Dense layer's input
    columns (multiply), in place: the same function. Returns the smoothed (min, max) per channel."""
    a = x_range.abs().amax(0).clamp(min=1e-5)  # (in,)
    w = dense.weight.abs().amax(0).clamp(min=1e-5)  # (in,)
    s = (a.pow(alpha) / w.pow(1 - alpha)).clamp(min=1e-5)
    norm.weight.div_(s)
    norm.bias.div_(s)
    dense.weight.mul_(s)
    return x_range / s


@torch.no_grad()
def quantize_calibrated(model: VisionTransformer, images: Tensor, batch_size: int = 64) -> VisionTransformer:
    """`model`, a copy (`copies.quantize_int8` builds it and wraps the result), made int8 in
    place, calibrated on `images` (N, C, H, W), normalised as the model expects (a few hundred
    training images are enough). It runs in rest_dtype() outside the Dense layers: it takes and
    returns that dtype."""
    if not available():
        raise ConfigError("calibrated int8 needs oneDNN's int8 kernels (an x86 build of PyTorch); "
                           "use deploy.quantize_int8(model) without calibration images instead")
    m = model.float().eval()
    ranges = channel_ranges(m, images, batch_size)
    int8 = []
    for block in m.blocks:
        dense = _dense_layers(block)
        qkv = smooth(block.norm1, dense["qkv"], ranges[dense["qkv"]])
        fc1 = smooth(block.norm2, dense["fc1"], ranges[dense["fc1"]])
        hidden = _tensor_range(ranges[dense["fc2"]])  # the GELU's output: fc1 writes it as uint8
        int8.append({
            "qkv": CalibratedInt8Linear(dense["qkv"], _tensor_range(qkv)),
            "proj": CalibratedInt8Linear(dense["proj"], _tensor_range(ranges[dense["proj"]])),
            "fc1": CalibratedInt8Linear(dense["fc1"], _tensor_range(fc1), out_range=hidden),
            "fc2": CalibratedInt8Linear(dense["fc2"], hidden),
        })
    m.to(rest_dtype())  # the rest in bf16 (fp32 without it); the int8 layers keep fp32 scales and biases
    for block, layers in zip(m.blocks, int8, strict=True):
        block.attn.qkv, block.attn.proj = layers["qkv"], layers["proj"]  # type: ignore[assignment]  # the copy's drop-in for the Dense layer
        block.mlp.fc1, block.mlp.fc2 = layers["fc1"], layers["fc2"]  # type: ignore[assignment]  # the copy's drop-in for the Dense layer
    return m


def calibrated_skeleton(model: VisionTransformer, rest: torch.dtype) -> VisionTransformer:
    """`model` (fresh, of a stored config) shaped as a calibrated copy, in `rest` outside the
    int8 layers, for load_state_dict and `restore` to fill (deploy.load_int8)."""
    if rest != torch.float32 and rest not in onednn_dtypes():
        raise CheckpointError(f"this int8 copy keeps its other layers in {str(rest).removeprefix('torch.')}, which this CPU's "
                              "oneDNN does not run: calibrate it again here (deploy.quantize_int8)")
    m = model.eval().to(rest)
    for block in m.blocks:
        dense = _dense_layers(block)
        block.attn.qkv, block.attn.proj = (CalibratedInt8Linear(dense[k], (0.0, 1.0), out_dtype=rest) for k in ("qkv", "proj"))  # type: ignore[assignment]  # the copy's drop-in for the Dense layer
        block.mlp.fc1 = CalibratedInt8Linear(dense["fc1"], (0.0, 1.0), out_range=(0.0, 1.0))  # type: ignore[assignment]  # the copy's drop-in for the Dense layer
        block.mlp.fc2 = CalibratedInt8Linear(dense["fc2"], (0.0, 1.0), out_dtype=rest)  # type: ignore[assignment]  # the copy's drop-in for the Dense layer
    return m


def restore_calibrated(model: VisionTransformer, rest: torch.dtype) -> VisionTransformer:
    """Every calibrated layer's scales and packed weight from the state just loaded."""
    for layer in model.modules():
        if isinstance(layer, CalibratedInt8Linear):
            layer.restore(rest)
    return model


def _tensor_range(channel_range: Tensor) -> tuple[float, float]:
    return float(channel_range[0].min()), float(channel_range[1].max())

