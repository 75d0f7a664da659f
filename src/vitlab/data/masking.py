"""Masked patch prediction's corruption (§4.6, Appendix B.1.2), drawn like an augmentation.

What the encoder sees of each patch is decided here, before the model runs, as a data
pipeline decides a crop: 50% of each image's patches are selected; of those, 80% have their
embedding replaced by the learnable [mask] embedding, 10% by the embedding of a random other
patch of the batch, and 10% keep their own (BERT's 80/10/10 split).

    kind, sources = draw(cfg, images, patch_size, generator)

`kind` (B, N) says what happened to each patch (the codes below: the loss reads every
selected patch, `vitlab inspect` colours them); `sources` (B, N) says which row of the
batch's patch embeddings, followed by the [mask] embedding as row B*N, replaces each one: its
own row when untouched or unchanged. The model (vitlab.models.mpp) only gathers those rows, so
it knows nothing of rates or codes. Masks are drawn on the CPU from torch's global generator
(or a given one), which the trainer checkpoints: a resumed run draws the same masks on every
device.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from vitlab.config import MPPConfig

# What happened to each patch, one code per patch in a (B, N) tensor.
UNTOUCHED, MASKED, RANDOM, UNCHANGED = 0, 1, 2, 3  # UNCHANGED: selected but kept as it was
KIND_NAMES = {MASKED: "mask", RANDOM: "random", UNCHANGED: "unchanged"}


def draw_corruption(batch: int, num_patches: int, mask_rate: float = 0.5, mask_token_frac: float = 0.8,
                    random_patch_frac: float = 0.1, generator: Optional[torch.Generator] = None) -> Tensor:
    """Which patches to corrupt and how: (B, N) int64 codes UNTOUCHED/MASKED/RANDOM/UNCHANGED.

    Exactly round(mask_rate * N) patches per image are selected (at least one, so the loss
    always has a term); each selected patch then independently becomes [mask], a random
    other patch, or stays, with probabilities mask_token_frac, random_patch_frac and the rest.
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


def draw_others(kind: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
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


def sources(kind: Tensor, others: Tensor) -> Tensor:
    """The row that replaces each patch's embedding, in the batch's B*N patch rows followed by
    the [mask] embedding (row B*N): the mask's for MASKED, `others`' for RANDOM, its own else."""
    own = torch.arange(kind.numel()).view_as(kind)
    rows = torch.where(kind == RANDOM, others, own)
    return torch.where(kind == MASKED, torch.full_like(rows, kind.numel()), rows)


def draw(cfg: MPPConfig, images: Tensor, patch_size: int,
         generator: Optional[torch.Generator] = None) -> tuple[Tensor, Tensor]:
    """The corruption of one batch of images (B, C, H, W) cut into patch_size patches, drawn
    with the options of `cfg`: (kind, sources), both (B, N) on the CPU."""
    n = (images.shape[-2] // patch_size) * (images.shape[-1] // patch_size)
    kind = draw_corruption(images.shape[0], n, cfg.mask_rate, cfg.mask_token_frac, cfg.random_patch_frac, generator)
    return kind, sources(kind, draw_others(kind, generator))
