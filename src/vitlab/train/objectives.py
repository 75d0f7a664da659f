"""Training objectives: what the loop minimises, kept apart from the backbone.

An objective is an `nn.Module` that wraps the VisionTransformer (a "meta architecture", as
dinov2 calls it). The trainer knows only this interface:

    objective = OBJECTIVES[cfg.train.objective].from_config(model, cfg)
    loss, metrics = objective(images, labels)      # training forward; metrics: floats/0-d tensors
    sums = objective.eval_step(images, labels)     # no grad; dict of tensors to be SUMMED over batches
    result = objective.finish_eval(sums)           # sums (over batches and processes) -> metrics
    objective.extra_tensors()                      # its own weights for the checkpoint
    objective.load_extra_tensors(tensors)          # ... and back

- `objective.model` is the VisionTransformer; the optimiser covers `objective.parameters()`,
  so an objective's own heads and tokens are trained too. Weight decay goes to matrices only
  (see `vitlab.train.optim.param_groups`): name tokens and embeddings "...token"/"...embedding".
- `from_config(model, run_config)` reads the objective's options from `run_config.objective`
  (the "objective" section of a recipe, `objective.KEY=VALUE` on the command line) and must
  reject unknown keys with a ConfigError naming the valid ones.
- Randomness (Mixup, masks, ...) comes from torch's global RNG. The trainer saves and restores
  it in every checkpoint, which is what keeps a resumed run bit-identical.
- `extra_tensors()` are written into the model checkpoint with
  `vitlab.checkpoints.io.write(model, path, extra_tensors=...)` (stored under "objective.")
  and come back through `Imported.extras`; fine-tuning leaves them behind.
- `eval_step` must return a "count" entry (examples seen); `finish_eval` turns the summed
  entries into the metrics written to metrics.jsonl/summary.json ("loss" at least).

To add one: subclass Objective, then add it to OBJECTIVES below (a plain table).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.config import ConfigError, RunConfig
from vitlab.eval.accuracy import batch_counts, metrics_from_counts
from vitlab.models.vit import VisionTransformer


class Objective(nn.Module):
    """The base of every objective: holds the model; subclasses define the loss."""

    def __init__(self, model: VisionTransformer):
        super().__init__()
        self.model = model

    @classmethod
    def from_config(cls, model: VisionTransformer, config: RunConfig) -> "Objective":
        return cls(model)

    def forward(self, images: Tensor, labels: Tensor) -> tuple[Tensor, dict[str, Any]]:
        raise NotImplementedError

    @torch.no_grad()
    def eval_step(self, images: Tensor, labels: Tensor) -> dict[str, Tensor]:
        raise NotImplementedError

    def finish_eval(self, sums: dict[str, Tensor]) -> dict[str, Any]:
        raise NotImplementedError

    def extra_tensors(self) -> dict[str, Tensor]:
        return {}

    def load_extra_tensors(self, tensors: dict[str, Tensor]) -> None:
        if tensors:
            raise ValueError(f"{type(self).__name__} has no extra tensors, got {sorted(tensors)}")


class Supervised(Objective):
    """Cross-entropy on the class labels (§4.1), with the later regularisers as options:
    label smoothing, and Mixup/CutMix through torchvision.transforms.v2 (which draw from
    torch's global RNG, so resume stays exact)."""

    def __init__(
        self,
        model: VisionTransformer,
        label_smoothing: float = 0.0,
        mixup: float = 0.0,
        cutmix: float = 0.0,
    ):
        super().__init__(model)
        self.label_smoothing = label_smoothing
        self.mix = None
        if mixup > 0 or cutmix > 0:
            from torchvision.transforms import v2

            k = model.config.num_classes
            mixers = ([v2.MixUp(alpha=mixup, num_classes=k)] if mixup > 0 else []) + (
                [v2.CutMix(alpha=cutmix, num_classes=k)] if cutmix > 0 else []
            )
            self.mix = mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers)

    @classmethod
    def from_config(cls, model: VisionTransformer, config: RunConfig) -> "Supervised":
        t = config.train
        return cls(model, t.label_smoothing, t.mixup, t.cutmix)

    def forward(self, images: Tensor, labels: Tensor) -> tuple[Tensor, dict[str, Any]]:
        targets: Tensor = labels
        if self.mix is not None:
            images, targets = self.mix(images, labels)  # soft targets (B, K)
        logits = self.model(images)
        loss = F.cross_entropy(logits.float(), targets, label_smoothing=self.label_smoothing)
        with torch.no_grad():
            accuracy = (logits.argmax(-1) == labels).float().mean()
        return loss, {"accuracy": accuracy}

    @torch.no_grad()
    def eval_step(self, images: Tensor, labels: Tensor) -> dict[str, Tensor]:
        logits = self.model(images)
        return batch_counts(logits.float(), labels, self.model.config.num_classes)

    def finish_eval(self, sums: dict[str, Tensor]) -> dict[str, Any]:
        return metrics_from_counts(sums)


# name -> class. The masked-patch-prediction objective (train/mpp.py) joins this table.
OBJECTIVES: dict[str, type[Objective]] = {
    "supervised": Supervised,
}


def build_objective(model: VisionTransformer, config: RunConfig) -> Objective:
    name = config.train.objective
    if name == "mpp" and "mpp" not in OBJECTIVES:
        from vitlab.train import mpp  # noqa: F401 - registers itself when present

    if name not in OBJECTIVES:
        raise ConfigError(f"unknown train.objective {name!r}; known objectives: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name].from_config(model, config)
