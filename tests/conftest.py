"""Fixtures and helpers the test files share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def perturb(model: torch.nn.Module, seed: int = 0, scale: float = 0.05) -> torch.nn.Module:
    """Move every parameter off its initial value (norm weights off 1, biases off 0), so that
    a dropped or misplaced tensor shows in the outputs. Returns the model in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def logits(model: torch.nn.Module, x: torch.Tensor, float64: bool = True) -> torch.Tensor:
    """The model's logits for x (a peer's output object unwrapped). In float64 by default:
    comparing two implementations then tests the function they compute, not the order in
    which their fp32 kernels happen to round."""
    if float64:
        model, x = model.double(), x.double()
    with torch.no_grad():
        out = model(x)
    out = getattr(out, "logits", out)
    if float64:
        model.float()
    return out


@pytest.fixture
def cifar_dir() -> Path:
    """The CIFAR-10 WebDataset shards of ../shared/data, or a skip saying where they were looked for."""
    path = SHARED_DATA / "cifar10"
    if not any(path.glob("train-*.tar*")):
        pytest.skip(f"needs the CIFAR-10 shards in {path}")
    return path
