"""The same ViT built by the peer libraries, for the benchmarks.

Each builder takes a vitlab `ViTConfig` and returns an eval-mode `nn.Module` that maps
(B, C, H, W) images to logits, with the same layer sizes (and so the same parameter count)
as `VisionTransformer(cfg)`. Weights are the peers' own random initialisation: speed does
not depend on the values. The GELU follows the config where the peer allows it
(torchvision's is always the exact one).
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from vitlab.checkpoints.hf import hf_config
from vitlab.checkpoints.timm import create_timm_model
from vitlab.checkpoints.torchvision import create_torchvision_model
from vitlab.config import ModelConfig, ViTConfig
from vitlab.extras import require

PEERS = ("timm", "hf", "torchvision")


def _check_plain(cfg: ViTConfig) -> None:
    if cfg.resnet is not None or cfg.pos_embed != "learned" or cfg.representation_size or not cfg.num_classes:
        raise ValueError(
            f"{cfg.name}: the peer models are built only for plain ViTs (learned 1D position "
            "embedding, no hybrid stem, no pre-logits, a classification head)"
        )


def timm_vit(cfg: ViTConfig) -> nn.Module:
    # The converter's builder: the timm model that computes what vitlab's does (GELU form,
    # epsilon, GAP without timm's extra fc_norm), so the two are timed on the same function.
    _check_plain(cfg)
    return create_timm_model(cfg).eval()


class _Logits(nn.Module):
    """Hugging Face models return an output object; the benchmark wants the logits tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(pixel_values=x).logits


def hf_vit(cfg: ViTConfig) -> nn.Module:
    # transformers is an optional peer and slow to import: only when this peer is built.
    require("peers", "the transformers peer", modules=("transformers",))
    from transformers import ViTConfig as HFConfig, ViTForImageClassification

    _check_plain(cfg)
    if cfg.classifier != "token" or cfg.image_size[0] != cfg.image_size[1]:
        raise ValueError(f"{cfg.name}: Hugging Face's ViT needs a class token and square images")
    # The converter's config.json: the transformers ViT that computes what vitlab's does.
    hf_cfg = HFConfig(**hf_config(cfg), attn_implementation="sdpa")  # type: ignore[call-arg]  # PretrainedConfig's, unannotated here
    return _Logits(ViTForImageClassification(hf_cfg)).eval()


def torchvision_vit(cfg: ViTConfig) -> nn.Module:
    # The converter's builder too; torchvision's GELU is always the exact one, so a tanh
    # variant is timed with exact GELU here (the full suite also runs everyone on exact GELU).
    _check_plain(cfg)
    return create_torchvision_model(cfg.replace(gelu="exact")).eval()


BUILDERS: dict[str, Callable[[ViTConfig], nn.Module]] = {
    "timm": timm_vit,
    "hf": hf_vit,
    "torchvision": torchvision_vit,
}


def build_peer(name: str, cfg: ModelConfig) -> nn.Module:
    if name not in BUILDERS:
        raise ValueError(f"unknown peer {name!r}; known peers: {', '.join(BUILDERS)}")
    if not isinstance(cfg, ViTConfig):
        raise ValueError(f"the peers build ViTs; {cfg.name} is a {cfg.kind} model: bench it as vitlab alone")
    return BUILDERS[name](cfg)
