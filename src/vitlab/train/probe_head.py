"""A fine-tune's new head started as a linear probe of the frozen features (LP-FT).

The paper starts the new head at zero (§3.2). With a zero head, the first steps' gradients
reach the pretrained blocks before the head knows anything about the new classes, and with a
small, briefly trained source they move the features away from what they were: a linear probe
on the frozen CIFAR-10 features of docs/transfer.md scores 98.1% on the digits, where the
fine-tune from a zero head reached 74%. Starting the head where the probe ends (linear probing,
then fine-tuning: Kumar et al., 2022, "Fine-Tuning can Distort Pretrained Features") keeps the
first steps from undoing the features.

`model.head_start=probe` fits the head as `vitlab linear-probe` does (eval/linear_probe.py:
multinomial logistic regression, L2 with C = 1 on standardised features), on the run's own
training split (train-minus-dev in a sweep arm, so the dev split stays unseen) at the model's
evaluation preprocessing, at most MAX_PER_CLASS images per class, and folds the
standardisation into the head's weights. Its forward passes are compute, counted in the run's
summary (`forward_images`).
"""

from __future__ import annotations

import time
from typing import Any, Optional, cast

import numpy as np
import torch

from vitlab.config import RunConfig
from vitlab.eval.features import extract_features
from vitlab.eval.linear_probe import fit_logistic, scaling
from vitlab.models import Model
from vitlab.train.build import plain_training_set
from vitlab.train.compute import ComputeMeter
from vitlab.train.inputs import Inputs

# The cap of docs/transfer.md's linear probes (`vitlab linear-probe --max-per-class 500`): all of
# Fashion-MNIST's 60,000 images would cost more forward passes than a short fine-tune trains on.
MAX_PER_CLASS = 500
C = 1.0  # as `vitlab linear-probe` (--C): scikit-learn's default
BELOW_START = 0.01  # a fine-tune this far (top-1) below its linear-probe start is warned about


def head_from_probe(feats: np.ndarray, labels: np.ndarray, num_classes: int, c: float = C
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight (K, F), bias (K,)) of a linear layer on the raw features whose logits are those of
    the logistic regression fitted on the standardised features: with x' = (x - mean) / std,
    x' W + b = x (W / std) + (b - (mean / std) W)."""
    x = torch.as_tensor(feats, dtype=torch.float64)
    mean, std = scaling(x)
    w, b = fit_logistic(((x - mean) / std).numpy(), labels, num_classes, c)
    return (w / std[:, None]).T.contiguous(), b - (mean / std) @ w


def fitted(model: torch.nn.Module, images: Any, max_per_class: int = MAX_PER_CLASS
           ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(weight, bias, what it cost and how well it fits) of the probe of the model's frozen
    features on `images`; the model is left as it was."""
    start = time.perf_counter()
    was_training = model.training
    feats, labels = extract_features(model, images, max_per_class=max_per_class)
    model.train(was_training)
    k = cast(torch.nn.Linear, model.head).out_features  # a classification head, as every run's
    if len(labels) == 0:
        raise ValueError("model.head_start=probe: the training split holds no images to fit the head on")
    weight, bias = head_from_probe(feats, labels, k)
    logits = torch.as_tensor(feats, dtype=torch.float64) @ weight.T + bias
    return weight, bias, {"images": int(len(labels)), "max_per_class": max_per_class, "C": C,
                          "train_top1": float((logits.argmax(1).numpy() == labels).mean()),
                          "seconds": round(time.perf_counter() - start, 3)}


def set_head(model: torch.nn.Module, weight: torch.Tensor, bias: torch.Tensor) -> None:
    with torch.no_grad():
        head = cast(torch.nn.Linear, model.head)
        head.weight.copy_(weight.to(head.weight))
        head.bias.copy_(bias.to(head.bias))


def for_run(cfg: RunConfig, model: Model, sources: Optional[tuple[Any, dict[str, Any]]],
            compute: ComputeMeter, inputs: Inputs) -> Optional[dict[str, Any]]:
    """With model.head_start=probe, fit the head of a new run's model on the run's training
    images (its split and subset, the evaluation transform; `sources`: data given as objects)
    and count its forward passes in `compute`; None otherwise. The fit is made once per
    model and split in `inputs` (the runs of one fine-tuning plan share it: the sweep's arms
    on train-minus-dev, the final run and the repeats on train); a run that reuses it counts
    no forward passes, since none were made for it, and says so ("shared_with_earlier_run").
    Every process of a distributed run fits the same head (the same weights, images and
    deterministic solver), and each one's forward passes count."""
    if cfg.model.head_start != "probe":
        return None

    def fit_now() -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        return fitted(model, plain_training_set(cfg, model.config, sources, inputs))

    # data given as objects: nothing names them for a later run
    weight, bias, result, fresh = (*fit_now(), True) if sources is not None else inputs.probe_head(probe_key(cfg, model), fit_now)
    set_head(model, weight, bias)
    if fresh:
        compute.forward_only(result["images"] * compute.processes)  # each process ran them all
        return dict(result)
    return {**result, "shared_with_earlier_run": True}


def probe_key(cfg: RunConfig, model: Model) -> dict[str, Any]:
    """What decides a probe head: the start weights and the network, the training images
    (spec, split, subset, data options) and the fit's settings."""
    d = cfg.data
    return {"checkpoint": cfg.model.checkpoint, "model": model.config.to_json(), "data": d.name,
            "split": d.train_split, "subset": [d.train_fraction, d.train_size, d.subset_seed],
            "dev_fraction": d.dev_fraction, "skip_bad_images": d.skip_bad_images, "classes": list(d.classes),
            "max_per_class": MAX_PER_CLASS, "C": C}


def lines(result: Optional[dict[str, Any]], start_step: int = 0) -> tuple[str, ...]:
    """The plan line of a head fitted at the start of this run (none on a resume)."""
    if not result or start_step:
        return ()
    cost = "fitted for an earlier run of this plan, reused" if result.get("shared_with_earlier_run") \
        else f"{result['seconds']:.1f} s"
    return (f"head: started as a linear probe of the frozen features (model.head_start=probe): {result['images']:,} "
            f"training images, top-1 {result['train_top1']:.1%} on them, {cost} (model.head_start=zeros for the paper's zero head)",)


def below_start(result: Optional[dict[str, Any]], results: dict[str, dict[str, Any]], steps: int,
                cfg: RunConfig) -> list[str]:
    """Warnings for a fine-tune that ended below the probe head it started from (`result`'s
    "start", the score at step 0): the steps undid what the frozen features already gave. The
    first suspect is training for something the probe was not fitted for (random crops, mirror
    images, smoothed labels: finetune_choice.ADAMW has the measurements), then a rate too high for
    the model or a warm-up too short; the run is worth less than its own first evaluation."""
    d, smoothing = cfg.data, cfg.train.label_smoothing
    augmented = [what for what, on in ((f"random crops (data.crop_scale={list(d.crop_scale)})", d.crop == "inception"),
                                       ("mirror images (data.hflip)", d.hflip),
                                       (f"smoothed labels (train.label_smoothing={smoothing:g})", smoothing > 0)) if on]
    fix = (f"it trained on {' and '.join(augmented)} and the probe head was fitted on whole, unflipped images and "
           "plain labels: set data.crop=whole data.hflip=false train.label_smoothing=0 (the AdamW recipe's), then "
           "lower --lr if it still falls"
           if augmented else f"the rate (optim.lr={cfg.optim.lr:g}) is too high for these weights or the warm-up "
           "too short; lower --lr, or leave it out for the dev-split choice")
    out = []
    for split, before in (result or {}).get("start", {}).items():
        after = results.get(split, {}).get("top1")
        if after is not None and after < before - BELOW_START:
            out.append(f"the fine-tune ended below its start: {split} top-1 {after:.1%} after {steps} steps, "
                       f"{before:.1%} with the linear-probe head alone (step 0): {fix}")
    return out
