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

Step 2's draw is the data's (vitlab.data.masking, like an augmentation): it says which row
replaces each patch embedding, and this module only gathers those rows. The VisionTransformer
stays plain (its `forward_features(x, patch_fn=...)` hook is where the corruption happens);
`MPPHead` holds the [mask] embedding and the prediction head, which travel in the checkpoint
as extras and are left behind when fine-tuning. The training objective
(vitlab.train.objectives) draws the masks and adds the loss; `vitlab inspect`
(vitlab.analysis.mpp) runs the same predictor to show what a checkpoint predicts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.config import ConfigError, MPPConfig
from vitlab.models.vit import VisionTransformer
from vitlab.pixels import unnormalise


# Corruption ------------------------------------------------------------------------------
def apply_corruption(x: Tensor, sources: Tensor, mask_token: Tensor) -> Tensor:
    """Corrupt patch embeddings x (B, N, D): each is replaced by row `sources` (B, N) of x's
    B*N rows followed by `mask_token` (D,) as row B*N (vitlab.data.masking draws them).

    Computed as a gather of the other patches' rows and two selects, not as one gather from
    [x; mask_token]: the values are the same either way, but this keeps the order in which the
    backward pass sums gradients that runs were trained with (one gather sums them in another
    order: weights 1e-8 apart after a few steps, so a resumed run would not be bit-exact)."""
    b, n, d = x.shape
    total = b * n
    src = sources.to(x.device)
    own = torch.arange(total, device=x.device).view(b, n)
    other = x.reshape(total, d)[src.clamp(max=total - 1).reshape(-1)].view(b, n, d)
    x = torch.where((src == total)[..., None], mask_token.to(x.dtype).expand(b, n, d), x)
    return torch.where(((src != own) & (src != total))[..., None], other, x)


# Targets ---------------------------------------------------------------------------------
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
    pixels = pixels[:, :, : gh * p, : gw * p]  # the patch grid (models.layers.PatchEmbed): the rest is read by no patch
    if cfg.target == "mean_color":
        means = F.avg_pool2d(pixels, p)  # (B, C, gh, gw)
        return quantise_colors(means.permute(0, 2, 3, 1).reshape(b, gh * gw, c), cfg.bits)
    if cfg.target == "color_grid":
        g = cfg.grid
        cells = F.avg_pool2d(pixels, p // g)  # (B, C, gh*g, gw*g)
        cells = cells.view(b, c, gh, g, gw, g).permute(0, 2, 4, 3, 5, 1)  # (B, gh, gw, g, g, C)
        return quantise_colors(cells.reshape(b, gh * gw, g * g, c), cfg.bits)
    patches = pixels.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 3, 5, 1)  # (B, gh, gw, P, P, C)
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
            raise ConfigError(f"{model_config.name} is a hybrid, whose ResNet stem sees the pixels of the corrupted patches: "
                              "pretrain a plain ViT (e.g. ViT-B/16) with objective=mpp instead")
        if cfg.target == "color_grid" and model_config.patch_size % cfg.grid:
            p = model_config.patch_size
            raise ConfigError(f"objective.target=color_grid needs the patch size ({p}) divisible by objective.grid ({cfg.grid})")
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

    def predict(self, model: VisionTransformer, images: Tensor, sources: Tensor) -> tuple[Tensor, Tensor]:
        """Corrupt as `sources` says (vitlab.data.masking.draw), encode, predict: predictions
        (B, N, out) and targets (B, N, ...) for every patch."""
        mc = model.config
        feats = model.forward_features(images, patch_fn=lambda x: apply_corruption(x, sources, self.mask_token))
        tokens = feats[:, model.num_prefix_tokens :]  # (B, N, D), the patch positions
        with torch.no_grad():
            targets = patch_targets(unnormalise(images.float(), mc.mean, mc.std), mc.patch_size, self.cfg)
        return self.head(tokens).float(), targets

    def extra_tensors(self) -> dict[str, Tensor]:
        return {"mask_token": self.mask_token.detach(), "head.weight": self.head.weight.detach(), "head.bias": self.head.bias.detach()}

    def load_extra_tensors(self, tensors: dict[str, Tensor]) -> None:
        expected = self.extra_tensors()
        if set(tensors) != set(expected):
            raise ValueError(f"MPP extras must be {sorted(expected)}, got {sorted(tensors)}")
        with torch.no_grad():
            for k, v in tensors.items():
                expected[k].copy_(v)
