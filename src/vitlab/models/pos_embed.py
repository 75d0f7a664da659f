"""Position embeddings (paper Eq. 1, Appendix D.4) and their resampling to new grids (§3.2).

Kinds:
- "learned":    1D learned, one row per token (class token included), the paper's default.
- "learned_2d": learned X and Y embeddings of D/2 each, concatenated per grid cell.
- "sincos_2d":  fixed 2D sine-cosine embedding (no parameters).
- "sincos_2d_big_vision": big_vision's `posemb_sincos_2d` (posemb='sincos2d', MoCo v3's):
                the same four quarters with x first and frequencies over quarter - 1.
- "relative":   1D relative attention; lives in the attention layers (see layers.py).
- "none":       nothing is added.

Resize modes (what "interpolate on the 2D grid" means differs between libraries):
- "bilinear_aligned":  bilinear with aligned corners; the official code's order-1 zoom.
- "bilinear":          bilinear, half-pixel centres (PyTorch's default).
- "bicubic":           bicubic, half-pixel centres.
- "bicubic_antialias": bicubic with an antialiasing filter when shrinking.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.config import RESIZE_MODES, ViTConfig


def resize_grid(grid: Tensor, new_size: tuple[int, int], mode: str) -> Tensor:
    """Resample a (gh, gw, C) grid of embeddings to (new_h, new_w, C)."""
    if mode not in RESIZE_MODES:
        raise ValueError(f"resize mode {mode!r} is not one of {RESIZE_MODES}")
    if tuple(grid.shape[:2]) == tuple(new_size):
        return grid
    x = grid.permute(2, 0, 1).unsqueeze(0)  # (1, C, gh, gw)
    if x.dtype not in (torch.float32, torch.float64):  # half types: resample in float32
        x = x.float()
    # RESIZE_MODES as F.interpolate's (mode, align_corners, antialias)
    kind, aligned, antialias = {"bilinear_aligned": ("bilinear", True, False), "bilinear": ("bilinear", False, False),
                                "bicubic": ("bicubic", False, False), "bicubic_antialias": ("bicubic", False, True)}[mode]
    x = F.interpolate(x, size=new_size, mode=kind, align_corners=aligned, antialias=antialias)
    return x[0].permute(1, 2, 0).to(grid.dtype)


def resize_line(table: Tensor, new_len: int, mode: str) -> Tensor:
    """Resample a (n, C) table along its first axis, with the 1D form of `mode`."""
    if table.shape[0] == new_len:
        return table
    return resize_grid(table.unsqueeze(1), (new_len, 1), mode)[:, 0]


def resize_token_embedding(
    pos: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int], num_prefix: int, mode: str
) -> Tensor:
    """Resize a (1, prefix + gh*gw, D) learned 1D position embedding (§3.2).

    The prefix rows (the class token's) are kept as they are; the rest is reshaped to its
    grid in raster order, resampled, and flattened back.
    """
    prefix, rest = pos[:, :num_prefix], pos[:, num_prefix:]
    gh, gw = old_grid
    if rest.shape[1] != gh * gw:
        raise ValueError(
            f"position embedding has {rest.shape[1]} patch rows, but the grid {gh}x{gw} needs {gh * gw}"
        )
    grid = rest[0].reshape(gh, gw, -1)
    grid = resize_grid(grid, new_grid, mode)
    return torch.cat([prefix, grid.reshape(1, new_grid[0] * new_grid[1], -1)], dim=1)


# The fixed kinds: (x first?, the frequency exponent's divisor is quarter minus this).
SINCOS = {"sincos_2d": (False, 0), "sincos_2d_big_vision": (True, 1)}


def sincos_2d(grid: tuple[int, int], dim: int, temperature: float = 10000.0, kind: str = "sincos_2d") -> Tensor:
    """Fixed 2D sin-cos embedding, (gh*gw, dim): a quarter of the channels each for sin and
    cos of y and of x (x first for big_vision's), at frequencies 1 / temperature^(i / n),
    i < quarter, n = quarter (big_vision's: quarter - 1, so the last one is 1 / temperature)."""
    x_first, less = SINCOS[kind]
    gh, gw = grid
    y, x = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64) / (quarter - less))
    y = y.flatten()[:, None] * omega[None]
    x = x.flatten()[:, None] * omega[None]
    first, second = (x, y) if x_first else (y, x)
    return torch.cat([first.sin(), first.cos(), second.sin(), second.cos()], dim=1).float()


class PositionEmbedding(nn.Module):
    """Adds E_pos to the token sequence (Eq. 1) for the absolute kinds.

    The class token (if any) is always the first token. For the 2D kinds it gets no
    position: its own learned embedding already tells it apart.
    """

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.kind = cfg.pos_embed
        self.grid = cfg.grid_size
        self.num_prefix = int(cfg.has_class_token)
        self.resize_mode = cfg.resize_mode
        d = cfg.hidden_size
        if self.kind == "learned":
            self.pos_embedding = nn.Parameter(torch.empty(1, cfg.num_tokens, d))
        elif self.kind == "learned_2d":
            self.row_embedding = nn.Parameter(torch.empty(self.grid[0], d // 2))  # Y
            self.col_embedding = nn.Parameter(torch.empty(self.grid[1], d // 2))  # X
        elif self.kind in SINCOS:
            self.register_buffer("pos_embedding", sincos_2d(self.grid, d, kind=self.kind)[None], persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for name in ("pos_embedding", "row_embedding", "col_embedding"):
            p = getattr(self, name, None)
            if isinstance(p, nn.Parameter):
                nn.init.normal_(p, std=0.02)

    def patch_table(self, grid: tuple[int, int]) -> Tensor:
        """(1, gh*gw, D) embedding of the patch tokens for a grid (resampled if it differs)."""
        if self.kind == "learned":
            pos = self.pos_embedding[:, self.num_prefix :]
            if grid != self.grid:
                pos = resize_token_embedding(pos, self.grid, grid, 0, self.resize_mode)
            return pos
        if self.kind == "learned_2d":
            rows = resize_line(self.row_embedding, grid[0], self.resize_mode)  # (gh, D/2)
            cols = resize_line(self.col_embedding, grid[1], self.resize_mode)  # (gw, D/2)
            gh, gw = grid
            table = torch.cat([rows[:, None].expand(gh, gw, -1), cols[None].expand(gh, gw, -1)], dim=-1)
            return table.reshape(1, gh * gw, -1)
        if self.kind in SINCOS:
            if grid == self.grid:
                return self.pos_embedding
            return sincos_2d(grid, self.pos_embedding.shape[-1], kind=self.kind).to(self.pos_embedding)[None]
        raise RuntimeError(f"pos_embed={self.kind!r} has no table")

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        # x: (B, prefix + gh*gw, D)
        if self.kind in ("none", "relative"):
            return x
        if self.kind == "learned":
            if grid == self.grid:
                return x + self.pos_embedding
            prefix_pos = self.pos_embedding[:, : self.num_prefix]
            return x + torch.cat([prefix_pos, self.patch_table(grid)], dim=1)
        patch = self.patch_table(grid)
        if self.num_prefix:
            return torch.cat([x[:, : self.num_prefix], x[:, self.num_prefix :] + patch], dim=1)
        return x + patch


def resize_position_state(
    state: dict[str, Tensor], prefix: str, old: ViTConfig, new: ViTConfig
) -> dict[str, Tensor]:
    """Rewrite the position tensors of a state dict from `old`'s grid to `new`'s (§3.2).

    Works on the learned kinds (1D and 2D) and on relative attention tables; the fixed
    sin-cos kind has nothing stored. Uses the *new* config's resize mode.
    """
    if old.grid_size == new.grid_size and old.num_tokens == new.num_tokens:
        return state
    out = dict(state)
    mode = new.resize_mode
    tables = [k for k in out if k.startswith(prefix) and (k[len(prefix):].startswith(("pos_embed.", "block_pos_embeds.")))]
    for key in tables:  # the stem's table and App. D.4's per-block ones
        if key.endswith(".pos_embedding") and new.pos_embed == "learned":
            out[key] = resize_token_embedding(out[key], old.grid_size, new.grid_size, int(old.has_class_token), mode)
        for axis, name in ((0, ".row_embedding"), (1, ".col_embedding")):
            if key.endswith(name):
                out[key] = resize_line(out[key], new.grid_size[axis], mode)
    for key in list(out):
        if key.startswith(prefix) and key.endswith("attn.rel_embedding"):
            out[key] = resize_line(out[key], 2 * new.num_tokens - 1, mode)
    return out
