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

The objective is a "meta architecture" around the backbone: the VisionTransformer stays plain
(its `forward_features(x, patch_fn=...)` hook is where the corruption happens), while the
[mask] embedding and the prediction head live here, travel in the checkpoint as extras, and
are left behind when fine-tuning. Masks are drawn on the CPU from torch's global generator
(or a given one), which the trainer checkpoints: a resumed run draws the same masks.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.config import ConfigError, MPPConfig, RunConfig
from vitlab.models.vit import VisionTransformer
from vitlab.train.objectives import OBJECTIVES, Objective

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


def check_backbone(model: VisionTransformer) -> None:
    """MPP needs each token to stand for exactly its own P x P pixel patch."""
    if model.backbone is not None:
        raise ConfigError(
            f"{model.config.name} is a hybrid: its ResNet stem sees every pixel before the patch "
            "embeddings are corrupted (receptive fields overlap), so a corrupted cell's colour "
            "leaks through its neighbours and masked patch prediction is not the paper's task; "
            "pretrain a plain ViT (e.g. ViT-C/4, ViT-B/16) with objective=mpp instead"
        )


# The objective ---------------------------------------------------------------------------
class MaskedPatchPrediction(Objective):
    """The MPP objective wrapped around a plain VisionTransformer (`self.model`).

    `forward(images, labels)` -> (loss, metrics); labels are ignored. The backbone's
    classifier head is removed (num_classes=0): the prediction head here is not a classifier,
    and fine-tuning adds the usual zero-initialised head (§3.2).
    """

    name = "mpp"

    def __init__(self, model: VisionTransformer, cfg: Optional[MPPConfig] = None):
        check_backbone(model)
        cfg = cfg or MPPConfig()
        mc = model.config
        if cfg.target == "color_grid" and mc.patch_size % cfg.grid:
            raise ConfigError(
                f"objective.target=color_grid averages each {mc.patch_size}x{mc.patch_size} patch onto "
                f"a {cfg.grid}x{cfg.grid} grid, which needs the patch size divisible by objective.grid; "
                f"pick objective.grid from the divisors of {mc.patch_size}"
            )
        if mc.num_classes:
            model.reset_classifier(0)
        super().__init__(model)
        self.cfg = cfg
        d = mc.hidden_size
        # A learnable [mask] embedding, initialised small like BERT's token embeddings.
        self.mask_token = nn.Parameter(torch.zeros(d))
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        # One linear layer reads each output token (the paper does not describe its head).
        # Zero weights: the first loss is exactly ln(classes) for the colour targets.
        self.head = nn.Linear(d, head_outputs(cfg, mc.in_channels, mc.patch_size))
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_config(cls, model: VisionTransformer, config: RunConfig) -> "MaskedPatchPrediction":
        return cls(model, config.objective)

    def corrupt(
        self, batch: int, num_patches: int, generator: Optional[torch.Generator] = None
    ) -> tuple[Tensor, Tensor]:
        """Draw which patches to corrupt and the random-patch sources: (kind, sources), (B, N)."""
        c = self.cfg
        kind = draw_corruption(batch, num_patches, c.mask_rate, c.mask_token_frac, c.random_patch_frac, generator)
        return kind, draw_sources(kind, generator)

    def predict(self, images: Tensor, generator: Optional[torch.Generator] = None) -> tuple[Tensor, Tensor, Tensor]:
        """Corrupt, encode, predict: kind (B, N), predictions (B, N, out), targets (B, N, ...)."""
        mc = self.model.config
        p = mc.patch_size
        b, n = images.shape[0], (images.shape[2] // p) * (images.shape[3] // p)
        kind, sources = self.corrupt(b, n, generator)
        feats = self.model.forward_features(
            images, patch_fn=lambda x: apply_corruption(x, kind, sources, self.mask_token)
        )
        tokens = feats[:, self.model.num_prefix_tokens :]  # (B, N, D), the patch positions
        with torch.no_grad():
            targets = patch_targets(unnormalise(images.float(), mc.mean, mc.std), p, self.cfg)
        return kind.to(images.device), self.head(tokens).float(), targets

    def forward(
        self, images: Tensor, labels: Optional[Tensor] = None, generator: Optional[torch.Generator] = None
    ) -> tuple[Tensor, dict[str, Any]]:
        kind, pred, targets = self.predict(images, generator)
        selected = kind != UNTOUCHED  # (B, N); the unchanged-but-selected count too
        loss, metrics = mpp_loss(pred[selected], targets[selected], self.cfg)
        # "accuracy" (what the trainer logs): the colour-class accuracy on corrupted patches.
        return loss, {("accuracy" if k == "color_acc" else k): v.detach() for k, v in metrics.items()}

    # Evaluation: masks from a fixed seed, so numbers compare across checkpoints and the
    # global generator -- hence resume -- is left alone.
    @torch.no_grad()
    def eval_step(self, images: Tensor, labels: Optional[Tensor] = None, seed: int = 0) -> dict[str, Tensor]:
        kind, pred, targets = self.predict(images, torch.Generator().manual_seed(seed))
        selected = kind != UNTOUCHED
        loss, metrics = mpp_loss(pred[selected], targets[selected], self.cfg)
        m = selected.sum()
        sums = {"count": torch.tensor(images.shape[0], device=images.device), "patches": m, "loss_sum": loss * m}
        if "color_acc" in metrics:
            sums["color_correct"] = metrics["color_acc"] * m  # per-patch mean over cells, x patches
        return {k: v.detach().double() for k, v in sums.items()}

    def finish_eval(self, sums: dict[str, Tensor]) -> dict[str, Any]:
        m = float(sums["patches"])
        out = {"loss": float(sums["loss_sum"]) / m, "count": int(sums["count"])}
        if "color_correct" in sums:
            out["color_acc"] = float(sums["color_correct"]) / m
        return out

    # Checkpoints -------------------------------------------------------------------------
    def extra_tensors(self) -> dict[str, Tensor]:
        """What the checkpoint stores beside the backbone (under checkpoints.io.EXTRA_PREFIX)."""
        return {
            "mask_token": self.mask_token.detach(),
            "head.weight": self.head.weight.detach(),
            "head.bias": self.head.bias.detach(),
        }

    def extra_metadata(self) -> dict[str, Any]:
        """Metadata naming the objective and its options, as the trainer writes it."""
        return {"objective": self.name, "objective_options": self.cfg.to_dict()}

    def load_extra_tensors(self, tensors: dict[str, Tensor]) -> None:
        expected = self.extra_tensors()
        if set(tensors) != set(expected):
            raise ValueError(f"MPP extras must be {sorted(expected)}, got {sorted(tensors)}")
        with torch.no_grad():
            for k, v in tensors.items():
                expected[k].copy_(v)

    @classmethod
    def from_checkpoint(cls, path) -> "MaskedPatchPrediction":
        """Rebuild backbone, [mask] embedding and prediction head from an MPP checkpoint."""
        from vitlab import checkpoints

        imported = checkpoints.read_checkpoint(path)
        return cls.from_imported(imported, str(path))

    @classmethod
    def from_imported(cls, imported, source: str) -> "MaskedPatchPrediction":
        from vitlab import checkpoints
        from vitlab.checkpoints.io import CheckpointError

        if "mask_token" not in imported.extras:
            raise CheckpointError(
                f"{source}: not a masked-patch-prediction checkpoint (objective="
                f"{imported.metadata.get('objective')!r}, no [mask] embedding among its tensors); "
                "train one with `vitlab train --objective mpp`"
            )
        cfg = MPPConfig.from_dict(json.loads(imported.metadata.get("objective_options") or "{}"))
        obj = cls(checkpoints.build_model(imported, source), cfg)
        obj.load_extra_tensors(imported.extras)
        return obj.eval()


# The trainer's objective table (train/objectives.py imports this module on demand).
OBJECTIVES["mpp"] = MaskedPatchPrediction

__all__ = [
    "MPPConfig",
    "MaskedPatchPrediction",
    "apply_corruption",
    "dequantise_colors",
    "draw_corruption",
    "draw_sources",
    "mpp_loss",
    "patch_targets",
    "quantise_colors",
    "unnormalise",
]
