"""The paper's fine-tuning protocol (§3.2, Appendix B.1.1, Table 4).

Fine-tuning starts from a pretrained checkpoint at a higher resolution: the pretrained head
and pre-logits layer are dropped, a zero-initialised D x K head is added, and the position
embeddings are resized to the new patch grid. SGD with momentum 0.9, cosine decay, no weight
decay, gradient clipping at 1, batch 512, and the number of steps per dataset of Table 4.
The learning rate is chosen from Table 4's grid on a held-out dev split (2% of CIFAR, 10% of
Pets and Flowers, 1% of ImageNet), then the run is repeated on the whole training set.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from vitlab.config import RunConfig
from vitlab.files import atomic_write_text
from vitlab.train import distributed

# Table 4: fine-tuning steps and the learning-rate grid per dataset.
TABLE4_STEPS = {"imagenet": 20_000, "cifar10": 10_000, "cifar100": 10_000, "pets": 500, "flowers": 500, "vtab": 2_500}
TABLE4_LRS = {
    "imagenet": (0.003, 0.01, 0.03, 0.06),
    "cifar10": (0.001, 0.003, 0.01, 0.03),
    "cifar100": (0.001, 0.003, 0.01, 0.03),
    "pets": (0.001, 0.003, 0.01, 0.03),
    "flowers": (0.001, 0.003, 0.01, 0.03),
    "vtab": (0.01,),
}


def lr_sweep(
    cfg: RunConfig,
    out: Path,
    grid: tuple[float, ...],
    train_fn: Callable[[RunConfig, Path], dict[str, Any]],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train once per learning rate on train-minus-dev, score on dev, retrain the best on train.

    `train_fn(config, run_folder) -> summary` runs one training (the Trainer). Each sweep run
    has its own folder under out/sweep/, so a stopped sweep resumes where it was.
    """
    scores = {}
    for lr in grid:
        sweep_cfg = cfg.with_overrides(
            {"optim.lr": lr, "data.train_split": "train-minus-dev", "data.eval_splits": ["dev"], "data.eval_data": ""}
        )
        summary = train_fn(sweep_cfg, out / "sweep" / f"lr-{lr:g}")
        scores[lr] = summary["splits"]["dev"]["top1"]
        log(f"lr-sweep: lr {lr:g} -> dev top-1 {scores[lr]:.2%}")
    best = max(grid, key=lambda lr: (scores[lr], -lr))
    log(f"lr-sweep: best lr {best:g}; training on the full training set")
    final = train_fn(cfg.with_overrides({"optim.lr": best}), out / "final")
    result = {"grid": list(grid), "dev_top1": {f"{k:g}": v for k, v in scores.items()}, "best_lr": best, "final": final}
    if distributed.is_main_process():
        atomic_write_text(out / "sweep.json", json.dumps(result, indent=2))
    return result
