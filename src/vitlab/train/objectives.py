"""Training objectives: what the loop minimises, kept apart from the backbone.

An objective is an `nn.Module` that wraps the model (a "meta architecture", as
dinov2 calls it). The trainer knows only this interface:

    objective = OBJECTIVES[cfg.train.objective].from_config(model, cfg)
    loss, metrics = objective(images, labels)      # training forward; metrics: floats/0-d tensors
    sums = objective.eval_step(images, labels)     # no grad; dict of tensors to be SUMMED over batches
    result = objective.finish_eval(sums)           # sums (over batches and processes) -> metrics
    objective.extra_tensors()                      # its own weights for the checkpoint
    objective.load_extra_tensors(tensors)          # ... and back

- `objective.model` is the VisionTransformer (or BiT ResNet); the optimiser covers `objective.parameters()`,
  so an objective's own heads and tokens are trained too. Weight decay goes to matrices only
  (see `vitlab.train.optim.param_groups`): name tokens and embeddings "...token"/"...embedding".
- `from_config(model, run_config)` reads the objective's options from `run_config.objective`
  (the "objective" section of a recipe, `objective.KEY=VALUE` on the command line), a typed
  dataclass that vitlab.config.OBJECTIVE_OPTIONS names for each objective.
- Randomness (Mixup, masks, ...) comes from torch's global RNG. The trainer saves and restores
  it in every checkpoint, which is what keeps a resumed run bit-identical.
- `extra_tensors()` are written into the model checkpoint with
  `vitlab.checkpoints.io.write(model, path, extra_tensors=...)` (stored under "objective.")
  and come back through `Imported.extras`; fine-tuning leaves them behind.
- `eval_step` must return a "count" entry (examples seen); `finish_eval` turns the summed
  entries into the metrics written to metrics.jsonl/summary.json ("loss" at least).

To add one: subclass Objective, add it to OBJECTIVES below (a plain table), and its options
class to vitlab.config.OBJECTIVE_OPTIONS.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.config import ConfigError, MPPConfig, RunConfig
from vitlab.data import masking
from vitlab.deploy import inference_copy
from vitlab.eval.accuracy import batch_counts, metrics_from_counts
from vitlab.models import Model
from vitlab.models.mpp import MPPHead, mpp_loss
from vitlab.models.vit import VisionTransformer


class Objective(nn.Module):
    """The base of every objective: holds the model; subclasses define the loss."""

    name = ""  # its train.objective value

    def __init__(self, model: Model):
        super().__init__()
        self.model = model

    @classmethod
    def from_config(cls, model: Model, config: RunConfig) -> "Objective":
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

    def checkpoint_metadata(self) -> dict[str, Any]:
        """What the model checkpoint records about the objective (its name and options)."""
        options = getattr(self, "cfg", None)
        return {"objective": self.name, "objective_options": options.to_dict() if options else {}}

    def load_extra_tensors(self, tensors: dict[str, Tensor]) -> None:
        if tensors:
            raise ValueError(f"{type(self).__name__} has no extra tensors, got {sorted(tensors)}")


class Supervised(Objective):
    """Cross-entropy on the class labels (§4.1), with the later regularisers as options:
    label smoothing, and Mixup/CutMix through torchvision.transforms.v2 (which draw from
    torch's global RNG, so resume stays exact)."""

    name = "supervised"

    def __init__(
        self,
        model: Model,
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
    def from_config(cls, model: Model, config: RunConfig) -> "Supervised":
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


class MaskedPatchPrediction(Objective):
    """Masked patch prediction (§4.6, Appendix B.1.2) around a plain VisionTransformer.

    `forward(images, labels)` -> (loss, metrics); labels are ignored. The backbone's
    classifier head is removed (num_classes=0): the prediction head (vitlab.models.mpp) is
    not a classifier, and fine-tuning adds the usual zero-initialised head (§3.2). The loss
    counts every selected patch, the unchanged 10% too (see vitlab.models.mpp).
    """

    name = "mpp"

    model: VisionTransformer  # the backbone MPP needs (from_config refuses the others)

    def __init__(self, model: VisionTransformer, cfg: Optional[MPPConfig] = None):
        cfg = cfg or MPPConfig()
        mpp = MPPHead(cfg, model.config)  # checks the backbone before anything changes
        if model.config.num_classes:
            model.reset_classifier(0)
        super().__init__(model)
        self.cfg = cfg
        self.mpp = mpp

    @classmethod
    def from_config(cls, model: Model, config: RunConfig) -> "MaskedPatchPrediction":
        if not isinstance(model, VisionTransformer):
            raise ConfigError(
                f"train.objective=mpp corrupts a ViT's patch embeddings (§4.6); {model.config.name} is a "
                "ResNet: train it with train.objective=supervised"
            )
        return cls(model, config.objective)

    def forward(
        self, images: Tensor, labels: Optional[Tensor] = None, generator: Optional[torch.Generator] = None
    ) -> tuple[Tensor, dict[str, Any]]:
        loss, metrics, _ = self._loss(images, generator)
        # "accuracy" (what the trainer logs): the colour-class accuracy on corrupted patches.
        return loss, {("accuracy" if k == "color_acc" else k): v.detach() for k, v in metrics.items()}

    def _loss(self, images: Tensor, generator: Optional[torch.Generator]) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        kind, sources = masking.draw(self.cfg, images, self.model.config.patch_size, generator)
        pred, targets = self.mpp.predict(self.model, images, sources)
        selected = (kind != masking.UNTOUCHED).to(images.device)  # (B, N); the unchanged-but-selected count too
        return *mpp_loss(pred[selected], targets[selected], self.cfg), selected

    # Evaluation: masks from a fixed seed, so numbers compare across checkpoints and the
    # global generator -- hence resume -- is left alone.
    @torch.no_grad()
    def eval_step(self, images: Tensor, labels: Optional[Tensor] = None, seed: int = 0) -> dict[str, Tensor]:
        loss, metrics, selected = self._loss(images, torch.Generator().manual_seed(seed))
        m = selected.sum()
        sums = {"count": torch.tensor(images.shape[0], device=images.device), "patches": m, "loss_sum": loss * m}
        if "color_acc" in metrics:
            sums["color_correct"] = metrics["color_acc"] * m  # per-patch mean over cells, x patches
        return {k: v.detach().double() for k, v in sums.items()}

    def finish_eval(self, sums: dict[str, Tensor]) -> dict[str, Any]:
        m = float(sums["patches"])
        out = {"loss": float(sums["loss_sum"]) / m, "count": int(sums["count"])}
        if "color_correct" in sums:
            out["color_acc"] = float(sums["color_correct"]) / m
        return out

    def extra_tensors(self) -> dict[str, Tensor]:
        return self.mpp.extra_tensors()

    def load_extra_tensors(self, tensors: dict[str, Tensor]) -> None:
        self.mpp.load_extra_tensors(tensors)


# train.objective -> the objective; vitlab.config.OBJECTIVE_OPTIONS names each one's options.
OBJECTIVES: dict[str, type[Objective]] = {cls.name: cls for cls in (Supervised, MaskedPatchPrediction)}


def build_objective(model: Model, config: RunConfig) -> Objective:
    return OBJECTIVES[config.train.objective].from_config(model, config)


def evaluation_target(objective: Objective, ema: Any, fast: bool) -> Objective:
    """The objective an evaluation runs: itself, or a copy with the EMA weights when Polyak
    averaging is on; with `fast` (a supervised run's final evaluation on one CPU process in
    fp32, which vtab's and finetune's test scores are), a copy whose model is vitlab's CPU
    inference path (`deploy.inference_copy`: the same logits to 1e-4). Never the trained
    objective changed."""
    if ema is None and not fast:
        return objective
    target = copy.deepcopy(objective)
    if ema is not None:
        ema.copy_to(target.model)
    if fast:
        target.model = inference_copy(target.model)  # type: ignore[assignment]  # a drop-in: the model's forward, packed
    return target
