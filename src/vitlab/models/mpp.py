"""Masked patch prediction (§4.6, Appendix B.1.2): self-supervised pretraining of a plain ViT.

The paper's recipe, step by step:

1. Embed the patches: x_p E, (B, N, D), Eq. 1 before the class token and E_pos join.
2. Select 50% of each image's patches. Of the selected ones, 80% have their embedding
   replaced by a learnable [mask] embedding, 10% by the embedding of a random other patch of
   the batch, and 10% keep their own (BERT's 80/10/10 split). The rest are untouched.
3. Run the encoder on the corrupted sequence.
4. For every selected patch -- the unchanged 10% too, or the model would learn that an
   intact-looking patch never needs predicting -- read the encoder's output token at its
   position, predict the target through a prediction head, and average the loss over the
   selected patches only.

Targets (the three the paper tried, Appendix B.1.2):
- "mean_color": the patch's mean colour with each channel quantised to 3 bits,
  q_c = min(floor(mean_c * 8), 7) on pixels in [0, 1]; class = q_r * 64 + q_g * 8 + q_b, one
  of 512. Cross-entropy. The paper's reported choice.
- "color_grid": the patch averaged down to a 4 x 4 grid of cells, each cell's mean colour
  quantised as above: 16 predictions of 512 classes. Cross-entropy averaged over the cells.
- "pixels": the patch's pixels in [0, 1], flattened as (P, P, C) like x_p of Eq. 1.
  L2 regression (mean squared error).

Pixels in [0, 1] are recovered from the model's input by undoing the config's normalisation
(x * std + mean), so the targets do not depend on which mean/std a model was built with.

The VisionTransformer stays plain (its `forward_features(x, patch_fn=...)` hook is where the
corruption happens); `MPPHead` holds the [mask] embedding and the prediction head, which
travel in the checkpoint as extras and are left behind when fine-tuning. The training
objective (vitlab.train.objectives) adds the loss; `vitlab inspect` (vitlab.analysis.mpp)
runs the same predictor to show what a checkpoint predicts. Masks are drawn on the CPU from
torch's global generator (or a given one), which the trainer checkpoints: a resumed run
draws the same masks.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.config import ConfigError, MPPConfig
from vitlab.models.vit import VisionTransformer

# What happened to each patch, one code per patch in a (B, N) tensor.
UNTOUCHED, MASKED, RANDOM, UNCHANGED = 0, 1, 2, 3  # UNCHANGED: selected but kept as it was
KIND_NAMES = {MASKED: "mask", RANDOM: "random", UNCHANGED: "unchanged"}


# Corruption ------------------------------------------------------------------------------
def draw_corruption(
    batch: int,
    num_patches: int,
    mask_rate: float = 0.5,
    mask_token_frac: float = 0.8,
    random_patch_frac: float = 0.1,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """Which patches to corrupt and how: (B, N) int64 codes UNTOUCHED/MASKED/RANDOM/UNCHANGED.

    Exactly round(mask_rate * N) patches per image are selected (at least one, so the loss
    always has a term); each selected patch then independently becomes [mask], a random
    other patch, or stays, with probabilities mask_token_frac, random_patch_frac and the rest.
    Drawn on the CPU so the stream of random numbers is the same on every device.
    """
    k = min(num_patches, max(1, int(mask_rate * num_patches + 0.5)))
    scores = torch.rand(batch, num_patches, generator=generator)
    chosen = scores.argsort(dim=1)[:, :k]  # k random positions per image
    selected = torch.zeros(batch, num_patches, dtype=torch.bool).scatter_(1, chosen, True)
    u = torch.rand(batch, num_patches, generator=generator)
    fate = torch.full((batch, num_patches), UNCHANGED, dtype=torch.long)
    fate[u < mask_token_frac + random_patch_frac] = RANDOM
    fate[u < mask_token_frac] = MASKED
    return torch.where(selected, fate, torch.full_like(fate, UNTOUCHED))


def draw_sources(kind: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
    """For each patch, the flat index (into the batch's B*N patches) of a random *other* patch.

    Drawn for every patch (only RANDOM ones use it) so the number of random draws per step is
    fixed. Index i is skipped by drawing from B*N - 1 values and shifting those >= i up by one.
    """
    total = kind.numel()
    own = torch.arange(total)
    if total < 2:
        return own.view_as(kind)
    src = torch.randint(0, total - 1, (total,), generator=generator)
    return (src + (src >= own).long()).view_as(kind)


def apply_corruption(x: Tensor, kind: Tensor, sources: Tensor, mask_token: Tensor) -> Tensor:
    """Corrupt patch embeddings x (B, N, D) as `kind` says; `mask_token` is (D,)."""
    b, n, d = x.shape
    kind = kind.to(x.device)[..., None]  # (B, N, 1)
    other = x.reshape(b * n, d)[sources.to(x.device).reshape(-1)].view(b, n, d)
    x = torch.where(kind == MASKED, mask_token.to(x.dtype).expand(b, n, d), x)
    return torch.where(kind == RANDOM, other, x)


# Targets ---------------------------------------------------------------------------------
def unnormalise(images: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """Model input back to pixels in [0, 1]: undo (pixel - mean) / std."""
    shape = (1, -1, 1, 1)
    m = torch.tensor(mean, dtype=images.dtype, device=images.device).view(shape)
    s = torch.tensor(std, dtype=images.dtype, device=images.device).view(shape)
    return (images * s + m).clamp(0.0, 1.0)


def quantise_colors(colors: Tensor, bits: int = 3) -> Tensor:
    """Colours (..., C) in [0, 1] to class indices: q_c = min(floor(c * 2^bits), 2^bits - 1),
    index = sum_c q_c * L^(C-1-c) with L = 2^bits (r*64 + g*8 + b for RGB at 3 bits)."""
    levels = 2**bits
    q = (colors * levels).floor().clamp(0, levels - 1).long()
    c = colors.shape[-1]
    place = levels ** torch.arange(c - 1, -1, -1, device=colors.device)  # (C,), e.g. (64, 8, 1)
    return (q * place).sum(-1)


def dequantise_colors(index: Tensor, channels: int = 3, bits: int = 3) -> Tensor:
    """Class indices to the centres of their colour bins, (..., C) in [0, 1]."""
    levels = 2**bits
    q = [(index // levels ** (channels - 1 - c)) % levels for c in range(channels)]
    return (torch.stack(q, dim=-1).float() + 0.5) / levels


def num_color_classes(channels: int, bits: int) -> int:
    return (2**bits) ** channels


def patch_targets(pixels: Tensor, patch_size: int, cfg: MPPConfig) -> Tensor:
    """Per-patch targets from pixels (B, C, H, W) in [0, 1], patches in raster order.

    mean_color: (B, N) int64; color_grid: (B, N, g*g) int64; pixels: (B, N, P*P*C) float.
    """
    b, c, h, w = pixels.shape
    p = patch_size
    gh, gw = h // p, w // p
    if cfg.target == "mean_color":
        means = F.avg_pool2d(pixels, p)  # (B, C, gh, gw)
        return quantise_colors(means.permute(0, 2, 3, 1).reshape(b, gh * gw, c), cfg.bits)
    if cfg.target == "color_grid":
        g = cfg.grid
        cells = F.avg_pool2d(pixels, p // g)  # (B, C, gh*g, gw*g)
        cells = cells.view(b, c, gh, g, gw, g).permute(0, 2, 4, 3, 5, 1)  # (B, gh, gw, g, g, C)
        return quantise_colors(cells.reshape(b, gh * gw, g * g, c), cfg.bits)
    patches = pixels.view(b, c, gh, p, gw, p).permute(0, 2, 4, 3, 5, 1)  # (B, gh, gw, P, P, C)
    return patches.reshape(b, gh * gw, p * p * c)


def head_outputs(cfg: MPPConfig, channels: int, patch_size: int) -> int:
    """Width of the prediction head for a target kind."""
    if cfg.target == "mean_color":
        return num_color_classes(channels, cfg.bits)
    if cfg.target == "color_grid":
        return cfg.grid**2 * num_color_classes(channels, cfg.bits)
    return patch_size * patch_size * channels


def mpp_loss(pred: Tensor, target: Tensor, cfg: MPPConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss over the selected patches only: pred (M, out), target as `patch_targets` gives
    for those M patches. Returns the loss and, for colour targets, the accuracy."""
    if cfg.target == "pixels":
        return F.mse_loss(pred, target), {}
    if cfg.target == "color_grid":
        pred = pred.reshape(pred.shape[0] * cfg.grid**2, -1)  # (M*g*g, classes)
        target = target.reshape(-1)
    loss = F.cross_entropy(pred, target)
    return loss, {"color_acc": (pred.argmax(-1) == target).float().mean()}


class MPPHead(nn.Module):
    """The [mask] embedding and the prediction head of masked patch prediction, and the
    predictor that corrupts, encodes and reads every patch token.

    Parameter and extra-tensor names ("mask_token", "head.weight", "head.bias") are the
    checkpoint contract: they are stored under the checkpoint's "objective." prefix.
    """

    def __init__(self, cfg: MPPConfig, model_config) -> None:
        super().__init__()
        if model_config.resnet is not None:
            raise ConfigError(
                f"{model_config.name} is a hybrid: its ResNet stem sees every pixel before the patch "
                "embeddings are corrupted (receptive fields overlap), so a corrupted cell's colour "
                "leaks through its neighbours and masked patch prediction is not the paper's task; "
                "pretrain a plain ViT (e.g. ViT-C/4, ViT-B/16) with objective=mpp instead"
            )
        if cfg.target == "color_grid" and model_config.patch_size % cfg.grid:
            p = model_config.patch_size
            raise ConfigError(
                f"objective.target=color_grid averages each {p}x{p} patch onto a {cfg.grid}x{cfg.grid} "
                f"grid, which needs the patch size divisible by objective.grid; pick objective.grid "
                f"from the divisors of {p}"
            )
        self.cfg = cfg
        d = model_config.hidden_size
        # A learnable [mask] embedding, initialised small like BERT's token embeddings.
        self.mask_token = nn.Parameter(torch.zeros(d))
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        # One linear layer reads each output token (the paper does not describe its head).
        # Zero weights: the first loss is exactly ln(classes) for the colour targets.
        self.head = nn.Linear(d, head_outputs(cfg, model_config.in_channels, model_config.patch_size))
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def corrupt(self, batch: int, num_patches: int, generator: Optional[torch.Generator] = None) -> tuple[Tensor, Tensor]:
        """Draw which patches to corrupt and the random-patch sources: (kind, sources), (B, N)."""
        c = self.cfg
        kind = draw_corruption(batch, num_patches, c.mask_rate, c.mask_token_frac, c.random_patch_frac, generator)
        return kind, draw_sources(kind, generator)

    def predict(
        self, model: VisionTransformer, images: Tensor, generator: Optional[torch.Generator] = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Corrupt, encode, predict: kind (B, N), predictions (B, N, out), targets (B, N, ...)."""
        mc = model.config
        p = mc.patch_size
        b, n = images.shape[0], (images.shape[2] // p) * (images.shape[3] // p)
        kind, sources = self.corrupt(b, n, generator)
        feats = model.forward_features(images, patch_fn=lambda x: apply_corruption(x, kind, sources, self.mask_token))
        tokens = feats[:, model.num_prefix_tokens :]  # (B, N, D), the patch positions
        with torch.no_grad():
            targets = patch_targets(unnormalise(images.float(), mc.mean, mc.std), p, self.cfg)
        return kind.to(images.device), self.head(tokens).float(), targets

    def extra_tensors(self) -> dict[str, Tensor]:
        return {"mask_token": self.mask_token.detach(), "head.weight": self.head.weight.detach(), "head.bias": self.head.bias.detach()}

    def load_extra_tensors(self, tensors: dict[str, Tensor]) -> None:
        expected = self.extra_tensors()
        if set(tensors) != set(expected):
            raise ValueError(f"MPP extras must be {sorted(expected)}, got {sorted(tensors)}")
        with torch.no_grad():
            for k, v in tensors.items():
                expected[k].copy_(v)
