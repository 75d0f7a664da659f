"""Fig. 6 and App. D.8: attention rollout (Abnar & Zuidema, 2020).

Per layer, average the attention over heads, add the identity for the residual connection
(Eq. 2 adds the block's input back), renormalise each row, and multiply the layers
together: R = Â_L ... Â_1. Row i of R says how much of token i's final state flowed from
each input token. The class token's row, restricted to the patches, is the map shown over
the image. A GAP model (App. D.3) has no class token; its representation is the mean over
patch tokens, so the map is the mean of the patch rows.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def rollout_matrix(attentions: Sequence[Tensor]) -> Tensor:
    """(B, T, T) rollout from per-block attentions (each (B, heads, T, T))."""
    result = None
    for attn in attentions:
        a = attn.detach().double().mean(dim=1)  # heads averaged, (B, T, T)
        a = a + torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)  # residual path
        a = a / a.sum(dim=-1, keepdim=True)  # rows back to distributions
        result = a if result is None else a @ result  # later layers act on earlier mixes
    if result is None:
        raise ValueError("no attention matrices given")
    return result


def attention_rollout(attentions: Sequence[Tensor], grid: tuple[int, int], num_prefix: int) -> np.ndarray:
    """(B, gh, gw) map over patches, scaled so each image's maximum is 1.

    With a class token (num_prefix = 1): its row of the rollout. Without (GAP): the mean of
    the patch rows, which is what the pooled representation reads.
    """
    r = rollout_matrix(attentions)
    if num_prefix:
        m = r[:, 0, num_prefix:]  # (B, N)
    else:
        m = r.mean(dim=1)
    gh, gw = grid
    if m.shape[1] != gh * gw:
        raise ValueError(f"rollout covers {m.shape[1]} patches, the grid {gh}x{gw} has {gh * gw}")
    m = m / m.amax(dim=1, keepdim=True).clamp_min(1e-30)
    return m.reshape(-1, gh, gw).float().cpu().numpy()


def upsample_map(maps: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(B, gh, gw) -> (B, H, W), bilinear, for drawing over the input image."""
    t = torch.from_numpy(np.asarray(maps, dtype=np.float32))[:, None]
    return F.interpolate(t, size=tuple(size), mode="bilinear", align_corners=False)[:, 0].numpy()
