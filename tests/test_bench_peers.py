"""vitlab.bench.peers: each library builds the same ViT (same sizes, same parameter count)."""

from __future__ import annotations

import pytest
import torch

from vitlab.api import create_model, get_config
from vitlab.bench.peers import PEERS, build_peer


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("peer", PEERS)
def test_a_peer_has_vitlabs_parameter_count_and_output(peer):
    pytest.importorskip({"timm": "timm", "hf": "transformers", "torchvision": "torchvision"}[peer])
    cfg = get_config("ViT-C/4", depth=2, image_size=16, num_classes=7)
    model = build_peer(peer, cfg)
    assert count(model) == count(create_model(cfg))
    assert not model.training
    with torch.no_grad():
        assert model(torch.randn(2, 3, 16, 16)).shape == (2, 7)


def test_what_a_peer_cannot_build_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown peer 'jax'"):
        build_peer("jax", get_config("ViT-C/4"))
    with pytest.raises(ValueError, match="class token"):
        build_peer("hf", get_config("ViT-C/4", classifier="gap"))
    with pytest.raises(ValueError, match="plain ViTs"):
        build_peer("timm", get_config("R50+ViT-B/16"))
