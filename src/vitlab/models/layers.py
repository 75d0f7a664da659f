"""Building blocks of the encoder (paper §3.1, Eq. 2-3): attention, MLP, pre-LN block."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vitlab.config import ModelConfig
from vitlab.models.pos_embed import resize_line


def dense(x: Tensor, weight: Tensor, bias: Optional[Tensor], gelu: Optional[str] = None) -> Tensor:
    """x W^T + b, then GELU if `gelu` is "none" (exact) or "tanh"; weight is (out, in).

    Public ops only, so `model(x)` is the same function in every process and exports,
    traces and compiles as written. The fast CPU kernels (packed weights with the
    bias and GELU fused) belong to the inference copy `vitlab.deploy.inference_copy` builds."""
    y = F.linear(x, weight, bias)
    return y if gelu is None else F.gelu(y, approximate=gelu)


class Dense(nn.Linear):
    """A Dense layer (`nn.Linear`: the same parameters), optionally followed by GELU."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, gelu: Optional[str] = None):
        super().__init__(in_features, out_features, bias)
        self.gelu = gelu  # None, or GELU's form as F.gelu names it: "none" (exact), "tanh"

    def forward(self, x: Tensor) -> Tensor:
        return dense(x, self.weight, self.bias, self.gelu)

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.gelu is None else f", gelu={self.gelu}")


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample while training."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class PatchEmbed(nn.Module):
    """x_p E of Eq. 1: a P x P convolution with stride P is the linear map of flattened patches."""

    def __init__(self, in_channels: int, dim: int, patch_size: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)
        # LeCun normal on the flattened patch, as the official embedding initialiser.
        fan_in = in_channels * patch_size * patch_size
        nn.init.trunc_normal_(self.proj.weight, std=(1.0 / fan_in) ** 0.5)
        nn.init.zeros_(self.proj.bias)  # type: ignore[arg-type]  # Conv2d's default bias=True: never None

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        # Eq. 1 as written: flatten each patch to x_p (C*P*P values, in the conv weight's
        # (c, i, j) order), then one matrix product with E. Same result as the strided conv,
        # but a single GEMM over all patches, which is 15-20% faster than the conv on CPU.
        B, C, H, W = x.shape
        P = self.patch_size
        gh, gw = H // P, W // P
        if gh * P != H or gw * P != W:  # a VALID convolution: the pixels past the last whole patch are not read
            x = x[:, :, : gh * P, : gw * P]
        patches = x.reshape(B, C, gh, P, gw, P).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * P * P)
        return dense(patches, self.proj.weight.flatten(1), self.proj.bias), (gh, gw)  # (B, N, D), raster order


class Attention(nn.Module):
    """Multi-head self-attention with fused q/k/v.

    Two paths compute the same function: PyTorch's fused `scaled_dot_product_attention`
    (fast, probabilities stay inside the kernel) and an exact path that materialises the
    softmax probabilities and can return them. With `num_relative` set, 1D relative attention
    (App. D.4) adds q . r_{i-j} to the logits before the softmax: the query attends to one
    learned embedding per token offset, used as keys.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attention_dropout: float = 0.0,
        dropout: float = 0.0,
        num_tokens_relative: Optional[int] = None,
        cpu_attention: str = "fused",
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = Dense(dim, 3 * dim, bias=qkv_bias)  # q, k, v along the output axis
        self.proj = Dense(dim, dim)
        self.attention_dropout = attention_dropout
        # The kernel on the CPU, chosen when the model is built and never by the input's dtype:
        # vitlab.deploy builds its inference copies with "fused" or "explicit", whichever measured
        # faster on the CPU at hand (vitlab.deploy.kernels), a training run by its precision.
        self.cpu_attention = cpu_attention
        self.proj_drop = nn.Dropout(dropout)
        self.rel_embedding: Optional[nn.Parameter] = None
        if num_tokens_relative is not None:
            # One embedding per offset p_q - p_k in [-(T-1), T-1].
            self.rel_embedding = nn.Parameter(torch.empty(2 * num_tokens_relative - 1, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.qkv.weight)
        nn.init.xavier_uniform_(self.proj.weight)
        if self.qkv.bias is not None:
            nn.init.zeros_(self.qkv.bias)
        nn.init.zeros_(self.proj.bias)
        if self.rel_embedding is not None:
            nn.init.normal_(self.rel_embedding, std=0.02)

    def relative_logits(self, q: Tensor) -> Tensor:
        """(B, h, T, T) logits q_i . r_{i-j}, scaled like the content logits."""
        B, h, T, dh = q.shape
        table: Optional[Tensor] = self.rel_embedding
        assert table is not None, "called only with relative position embeddings"
        if table.shape[0] != 2 * T - 1:  # another input size: resample the offsets
            table = resize_line(table, 2 * T - 1, "bilinear_aligned")
        r = table.reshape(2 * T - 1, h, dh).transpose(0, 1)  # (h, 2T-1, dh)
        logits = (q * self.scale) @ r.transpose(1, 2).unsqueeze(0)  # (B, h, T, 2T-1)
        pos = torch.arange(T, device=q.device)
        index = (pos[:, None] - pos[None, :] + T - 1).expand(B, h, T, T)
        return torch.gather(logits, 3, index)

    def forward(
        self, x: Tensor, return_attention: bool = False, queries: Optional[int] = None
    ) -> tuple[Tensor, Optional[Tensor]]:
        """`queries=n`: the output at the first n tokens only, (B, n, D); every token is
        still a key and a value. Not with relative attention (its offsets assume all queries)."""
        B, T, D = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        # On a GPU the fused (flash) kernel stays: it is fast there and never stores (T, T) matrices.
        exact = return_attention or (qkv.device.type == "cpu" and self.cpu_attention == "explicit")
        if exact:  # one copy to (3, B, h, T, dh), so the batched products read q, k, v in place
            qkv = qkv.contiguous()
        q, k, v = qkv.unbind(0)  # each (B, h, T, dh)
        bias = self.relative_logits(q) if self.rel_embedding is not None else None
        if queries is not None:
            if bias is not None:
                raise ValueError("queries=... is not supported with relative attention")
            q, T = q[:, :, :queries], queries  # (B, h, n, dh)
        p_drop = self.attention_dropout if self.training else 0.0
        attn = None
        if exact:
            logits = (q * self.scale) @ k.transpose(-2, -1)  # (B, h, T, T)
            if bias is not None:
                logits = logits + bias
            probs = logits.softmax(dim=-1)
            out = F.dropout(probs, p_drop, self.training) @ v
            attn = probs if return_attention else None
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p_drop)
        out = out.transpose(1, 2).reshape(B, T, D)  # heads back on the feature axis
        return self.proj_drop(self.proj(out)), attn


class Mlp(nn.Module):
    """Dense -> GELU -> dropout -> Dense -> dropout (the paper's MLP block)."""

    def __init__(self, dim: int, hidden: int, gelu: str = "exact", dropout: float = 0.0):
        super().__init__()
        self.fc1 = Dense(dim, hidden, gelu="tanh" if gelu == "tanh" else "none")  # Dense -> GELU
        self.fc2 = Dense(hidden, dim)
        self.drop = nn.Dropout(dropout)
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.normal_(fc.bias, std=1e-6)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.fc1(x))))


class Block(nn.Module):
    """One pre-LN encoder block: Eq. 2 then Eq. 3."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_dim: int,
        *,
        qkv_bias: bool,
        gelu: str,
        layer_norm_eps: float,
        dropout: float,
        attention_dropout: float,
        drop_path: float,
        num_tokens_relative: Optional[int] = None,
        cpu_attention: str = "fused",
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=layer_norm_eps)
        self.attn = Attention(dim, num_heads, qkv_bias, attention_dropout, dropout, num_tokens_relative, cpu_attention)
        self.norm2 = nn.LayerNorm(dim, eps=layer_norm_eps)
        self.mlp = Mlp(dim, mlp_dim, gelu, dropout)
        self.drop_path = DropPath(drop_path)

    def forward(
        self, x: Tensor, return_attention: bool = False, queries: Optional[int] = None
    ) -> tuple[Tensor, Optional[Tensor]]:
        """`queries=n` returns only the first n tokens' outputs (B, n, D) (see Attention)."""
        y, attn = self.attn(self.norm1(x), return_attention, queries)
        if queries is not None:
            x = x[:, :queries]
        x = x + self.drop_path(y)  # Eq. 2: z' = MSA(LN(z)) + z
        x = x + self.drop_path(self.mlp(self.norm2(x)))  # Eq. 3: z = MLP(LN(z')) + z'
        return x, attn


class Classifier:
    """What both model kinds share (`VisionTransformer`, `BiTResNet`): the head, a linear layer
    on the `config.feature_dim` representation made on the device and dtype of `self.norm`;
    gradient checkpointing of their blocks; how they print."""

    grad_checkpointing = False
    config: ModelConfig  # each kind narrows it to its own (ViTConfig, BiTConfig)
    norm: nn.LayerNorm | nn.GroupNorm  # the last norm before the head
    head: nn.Module

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each block (a ViT's encoder block, a ResNet's residual unit) in the backward
        pass instead of keeping its activations: memory for compute. Dropout masks are
        replayed, so the numbers do not change."""
        self.grad_checkpointing = enabled

    def run_block(self, block: nn.Module, *args: Any) -> Any:
        """`block(*args)`, recomputed in the backward pass when checkpointing is on."""
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(block, *args, use_reentrant=False)
        return block(*args)

    def extra_repr(self) -> str:
        return f"name={self.config.name!r}, image_size={self.config.image_size}"

    def reset_classifier(self, num_classes: int, init: Optional[str] = None) -> None:
        """Replace the head with a fresh one: zero-initialised by default (the paper's
        fine-tuning head, §3.2, and BiT's transfer head) or Xavier-uniform; none for 0 classes."""
        init = init or self.config.head_init
        head: nn.Module = nn.Identity()
        if num_classes:
            head = nn.Linear(self.config.feature_dim, num_classes)
            if init == "zeros":
                nn.init.zeros_(head.weight)
            else:
                nn.init.xavier_uniform_(head.weight)
            nn.init.zeros_(head.bias)
            head = head.to(self.norm.weight.device, self.norm.weight.dtype)
        self.head = head
        if num_classes != self.config.num_classes or init != self.config.head_init:
            self.config = self.config.replace(num_classes=num_classes, head_init=init)
