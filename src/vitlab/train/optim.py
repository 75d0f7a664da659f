"""Optimisers and learning-rate schedules of the paper (Appendix B.1, Tables 3 and 4).

Pretraining: Adam (beta1 0.9, beta2 0.999) with weight decay, linear warm-up, then linear or
cosine decay. Fine-tuning: SGD with momentum 0.9, cosine decay, no weight decay. Both clip
the global gradient norm at 1 (done by the loop).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vitlab.config import OptimConfig
from vitlab.deploy.training import fused_optimizer


def decays(name: str, param: nn.Parameter) -> bool:
    """Weight decay on matrices only (nanoGPT's rule, as the official code): tensors with
    dim >= 2 -- linear and patch-embedding weights -- but not biases, norms, the position
    embeddings, the class token or any other token/embedding table (a [mask] token)."""
    leaf = name.rsplit(".", 1)[-1]
    if param.ndim < 2:
        return False
    return not ("token" in leaf or "embedding" in leaf or name.startswith("pos_embed") or ".pos_embed." in name)


def param_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: with weight decay ("decay") and without ("no_decay"); names kept for tests."""
    with_wd: list[tuple[str, nn.Parameter]] = []
    without: list[tuple[str, nn.Parameter]] = []
    for name, p in module.named_parameters():
        if p.requires_grad:
            (with_wd if decays(name, p) else without).append((name, p))
    return [
        {"params": [p for _, p in with_wd], "names": [n for n, _ in with_wd], "weight_decay": weight_decay, "group": "decay"},
        {"params": [p for _, p in without], "names": [n for n, _ in without], "weight_decay": 0.0, "group": "no_decay"},
    ]


def build_optimizer(module: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    groups = param_groups(module, cfg.weight_decay)
    for g in groups:
        del g["names"]  # the optimiser's state dict must hold tensors and primitives only
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
    # "adamw": decoupled weight decay (Loshchilov & Hutter), the modern reading of the
    # paper's "Adam with weight decay"; "adam" adds the decay to the gradient (L2).
    # fused: one kernel per tensor, not torch's CPU default of five or six operators per tensor
    # (issue 51). A checkpoint keeps the flag in its param_groups, so a run resumes on the
    # update it was trained with.
    cls = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
    fused = fused_optimizer(p for g in groups for p in g["params"])
    return cls(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused or None)


def lr_at(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Learning rate of optimiser step `step` (0-based): linear warm-up from 0 over
    warmup_steps, then cosine or linear decay to end_lr at total_steps (or constant)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.decay == "constant":
        return cfg.lr
    span = max(total_steps - cfg.warmup_steps, 1)
    progress = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
    if cfg.decay == "linear":
        factor = 1.0 - progress
    else:
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.end_lr + (cfg.lr - cfg.end_lr) * factor


class EMA:
    """Polyak averaging of the model's floating-point state (the paper's 0.9999, §4.1 / Table 2).

    The effective decay ramps up as min(decay, (1 + n) / (10 + n)) after n updates -- the
    TensorFlow ExponentialMovingAverage rule -- so that a short run is not dominated by its
    random initialisation.
    """

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.updates = 0
        self.shadow = {k: v.detach().clone().float() for k, v in model.state_dict().items() if v.is_floating_point()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for k, v in model.state_dict().items():
            if k in self.shadow:
                self.shadow[k].mul_(d).add_(v.detach().float(), alpha=1 - d)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.shadow

    def copy_to(self, model: nn.Module) -> None:
        state = model.state_dict()
        model.load_state_dict({**state, **{k: v.to(state[k].dtype) for k, v in self.shadow.items()}})
