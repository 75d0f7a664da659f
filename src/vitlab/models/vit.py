"""The Vision Transformer, as the paper writes it (§3.1, Eq. 1-4, Appendix D).

    z0  = [x_class; x_p^1 E; ...; x_p^N E] + E_pos          (Eq. 1)
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                       (Eq. 2)
    z_l  = MLP(LN(z'_l)) + z'_l                              (Eq. 3)
    y    = LN(z_L^0)                                         (Eq. 4)

then an optional pre-logits layer (Dense + tanh) and the classification head.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor, nn

from vitlab.config import ViTConfig
from vitlab.models.inputs import as_image_batch
from vitlab.models.layers import Block, Classifier, PatchEmbed
from vitlab.models.pos_embed import PositionEmbedding
from vitlab.models.resnet import ResNetStem

PatchFn = Callable[[Tensor], Tensor]


class VisionTransformer(Classifier, nn.Module):
    """A ViT built from a `ViTConfig`.

    Input: an NCHW float tensor already normalised as `config.mean`/`config.std` say.
    `model(x)` returns logits (or pooled features when `num_classes == 0`);
    `model(x, return_intermediates=True)` returns a dict with the logits, the tokens after
    each block and each block's attention probabilities (B, heads, T, T), computed by the
    exact attention path. `cpu_attention` ("fused" or "explicit") fixes the attention kernel
    on the CPU whatever the input's dtype, a choice made here only (vitlab.deploy builds its
    copies with the one measured faster, a training run by its precision: deploy/training.py).
    """

    def __init__(self, config: ViTConfig, *, cpu_attention: str = "fused"):
        super().__init__()
        self.config: ViTConfig = config
        self.class_names: Optional[list[str]] = None  # carried into checkpoints
        cfg = config
        d = cfg.hidden_size

        # Hybrid (§3.1): patches of a ResNet feature map instead of raw pixels.
        self.backbone = ResNetStem(cfg.resnet, cfg.in_channels) if cfg.resnet else None
        embed_in = self.backbone.out_channels if self.backbone else cfg.in_channels
        self.patch_embed = PatchEmbed(embed_in, d, cfg.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if cfg.has_class_token else None
        self.pos_embed = PositionEmbedding(cfg)
        # App. D.4's every-layer variants: block i > 0 adds its own table (official-style path
        # Transformer/encoderblock_{i}/posembed_input/pos_embedding), or pos_embed again (shared).
        self.block_pos_embeds = nn.ModuleDict(
            {f"encoderblock_{i}": PositionEmbedding(cfg) for i in range(1, cfg.depth)}
        ) if cfg.pos_embed_at == "every_block" else None
        self.pos_drop = nn.Dropout(cfg.dropout)

        relative = cfg.num_tokens if cfg.pos_embed == "relative" else None
        # Stochastic depth grows linearly with depth, from 0 at the first block.
        drop_rates = [cfg.drop_path * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        # an nn.ModuleList; typed as the Blocks it holds, which nn.ModuleList's stubs cannot say
        self.blocks: Sequence[Block] = nn.ModuleList(  # type: ignore[assignment]
            Block(
                d,
                cfg.num_heads,
                cfg.mlp_dim,
                qkv_bias=cfg.qkv_bias,
                gelu=cfg.gelu,
                layer_norm_eps=cfg.layer_norm_eps,
                dropout=cfg.dropout,
                attention_dropout=cfg.attention_dropout,
                drop_path=rate,
                num_tokens_relative=relative,
                cpu_attention=cpu_attention,
            )
            for rate in drop_rates
        )
        self.norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)

        self.pre_logits: Optional[nn.Linear] = None
        if cfg.representation_size:
            self.pre_logits = nn.Linear(d, cfg.representation_size)
            nn.init.xavier_uniform_(self.pre_logits.weight)
            nn.init.zeros_(self.pre_logits.bias)
        self.head: nn.Module = nn.Identity()
        self.reset_classifier(cfg.num_classes)

    # Eq. 1 -------------------------------------------------------------------------------
    def embed(self, x: Tensor, patch_fn: Optional[PatchFn] = None) -> tuple[Tensor, tuple[int, int]]:
        """Pixels to the token sequence z0 (before dropout).

        `patch_fn` may rewrite the patch embeddings x_p E (B, N, D) before the class token
        and the position embedding join them: where masked patch prediction (§4.6) corrupts.
        """
        x = self._check_input(x)
        if self.backbone is not None:
            x = self.backbone(x)  # (B, C, H/s, W/s)
        x, grid = self.patch_embed(x)  # (B, N, D)
        if patch_fn is not None:
            x = patch_fn(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1+N, D)
        return self.pos_embed(x, grid), grid

    def _check_input(self, x: Tensor) -> Tensor:
        """`x` as this model's input (models/inputs.py: dtypes, uint8 pixels, numpy, layout and
        channels), its size checked against the grid."""
        cfg = self.config
        x = as_image_batch(x, self.patch_embed.proj.weight, cfg)
        size = tuple(x.shape[2:])
        if cfg.dynamic_image_size:
            s = cfg.total_stride
            if min(size) < s:  # any larger size: the grid a VALID patch convolution takes (ViTConfig.grid_size)
                raise ValueError(f"input size {size[0]}x{size[1]} is smaller than one patch ({s} px)")
        elif size != cfg.image_size:
            raise ValueError(
                f"{cfg.name} was built for {cfg.image_size[0]}x{cfg.image_size[1]} images, got "
                f"{size[0]}x{size[1]}; resize the input, create the model with image_size={size}, "
                "or pass dynamic_image_size=True"
            )
        return x

    # Eq. 2-4 -----------------------------------------------------------------------------
    def add_position(self, i: int, z: Tensor, grid: tuple[int, int]) -> Tensor:
        """The input of block i: z, plus the position embedding again where pos_embed_at says
        (block 0's is added in `embed`)."""
        at = self.config.pos_embed_at
        if i == 0 or at == "stem":
            return z
        if self.block_pos_embeds is None:  # every_block_shared: the stem's table again
            return self.pos_embed(z, grid)
        return self.block_pos_embeds[f"encoderblock_{i}"](z, grid)

    def encode(self, x: Tensor, patch_fn: Optional[PatchFn] = None, *, queries: Optional[int] = None,
               record: Optional[dict[str, Any]] = None) -> Tensor:
        """The encoder, Eq. 1-3 and Eq. 4's LayerNorm: every caller's one loop. Returns the
        tokens after the final LayerNorm, (B, T, D).

        `queries=n`: the last block computes its output at the first n tokens only, (B, n, D)
        (see `Attention`). `record`: a dict that receives z0 ("embeddings"), each block's
        tokens and attention probabilities (the exact attention path computes them) and the
        patch grid. Each block is checkpointed when `set_grad_checkpointing` says so."""
        z, grid = self.embed(x, patch_fn)  # Eq. 1: z0, (B, T, D)
        if record is not None:
            record.update(embeddings=z, tokens=[], attentions=[], grid=grid)
        z = self.pos_drop(z)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            z_in = self.add_position(i, z, grid)
            z, attn = self.run_block(block, z_in, record is not None, queries if i == last else None)  # Eq. 2-3
            if record is not None:
                record["tokens"].append(z)  # z_l, (B, T, D)
                record["attentions"].append(attn)  # (B, heads, T, T)
        return self.norm(z)  # the LN of Eq. 4, on every token

    def forward_features(self, x: Tensor, patch_fn: Optional[PatchFn] = None) -> Tensor:
        """All tokens after the final LayerNorm, (B, T, D)."""
        return self.encode(x, patch_fn)

    @property
    def head_queries(self) -> Optional[int]:
        """What the head reads of the last block: 1 when it reads the class token alone.

        Eq. 4 reads only the class token of the last block, z_L^0. In that block every token
        is still a key and value of attention, but the query, attention output, MLP and final
        LayerNorm are needed at the class token alone: for ViT-B/16 at 224 this skips about
        6% of the model's FLOPs (7% for the 9-block ViT-C/4). Relative attention's offsets
        assume every query, and GAP reads every token: None (all tokens) for them."""
        return 1 if self.config.classifier == "token" and self.config.pos_embed != "relative" else None

    def pool(self, feats: Tensor) -> Tensor:
        """The image representation: the class token (Eq. 4) or the mean of the tokens (GAP)."""
        if self.config.classifier == "token":
            return feats[:, 0]
        return feats.mean(dim=1)

    def forward_head(self, feats: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens to logits; `pre_logits=True` stops at the representation the head reads."""
        x = self.pool(feats)
        if self.pre_logits is not None:
            x = torch.tanh(self.pre_logits(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor, return_intermediates: bool = False) -> Any:
        if not return_intermediates:
            return self.forward_head(self.encode(x, queries=self.head_queries))
        record: dict[str, Any] = {}
        feats = self.encode(x, record=record)
        representation = self.forward_head(feats, pre_logits=True)
        return {
            "logits": self.head(representation),
            "embeddings": record["embeddings"],  # z0, (B, T, D)
            "tokens": record["tokens"],  # per block, (B, T, D)
            "attentions": record["attentions"],  # per block, (B, heads, T, T)
            "features": feats,  # after the final norm, (B, T, D)
            "pre_logits": representation,  # what the head reads, (B, feature_dim)
            "grid": record["grid"],
        }

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.cls_token is not None)
