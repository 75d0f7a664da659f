"""What a run trains: the network its model section names, and the datasets it reads."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Optional

import torch

from vitlab import checkpoints
from vitlab.checkpoints.peers import variant_config
from vitlab.config import ConfigError, ModelConfig, ModelSection, RunConfig
from vitlab.data import DataOptions, foreign, make_loader, training_subset
from vitlab.data.transforms import AUGMENT_OPTIONS, fast_model_transform, model_transform
from vitlab.deploy import training
from vitlab.models import Model, build
from vitlab.train.inputs import Inputs

# A checkpoint's evaluation crop belongs to its pre-training data (ImageNet's 0.875); a
# fine-tuned model is evaluated on whole images, as the paper does, unless the section says.
FINETUNE_PREPROCESSING = {"crop_fraction": 1.0, "crop_mode": "squash"}


def architecture(section: ModelSection, inputs: Inputs) -> ModelConfig:
    """The network a run trains, before the class count is known: a registered variant, or
    the one a start checkpoint holds (read through `inputs`, once), with the section's changes."""
    if section.checkpoint:
        config = inputs.checkpoint(section.checkpoint).config
        return config.replace(**_applicable(config, {**FINETUNE_PREPROCESSING, **section.changes}))
    return variant_config(section.name, **section.changes)


def _applicable(config: ModelConfig, changes: dict[str, Any]) -> dict[str, Any]:
    """The changes a start checkpoint's network can take. A recipe's `key: null` ("none of
    it", e.g. finetune.yaml's representation_size: null, which drops a ViT's pre-logits) is
    already true of a network without that part (a BiT ResNet), so it is left out; any other
    key the network lacks stays, to be refused by name."""
    own = {f.name for f in dataclasses.fields(config)}
    return {k: v for k, v in changes.items() if k in own or v is not None}


def build_model(section: ModelSection, class_names: list[str], inputs: Inputs, precision: str) -> Model:
    """The run's network for these classes: a new one of the named variant, or the start
    checkpoint's (read through `inputs`) with the fine-tuning changes and a fresh zero head."""
    kernel = training.training_attention(precision)
    changes = {"num_classes": len(class_names), **section.changes}
    if section.checkpoint:
        imported = inputs.checkpoint(section.checkpoint)
        changes = _applicable(imported.config, {**FINETUNE_PREPROCESSING, **changes})
        # Fine-tuning (§3.2): position embeddings resized to the new resolution, the head
        # replaced when the class count changes, pre-logits dropped with representation_size=None.
        model = checkpoints.build_model(imported, section.checkpoint, kernel, **changes)
        # A fresh zero head, always; model.head_start=probe then fits it in the trainer
        # (train/probe_head.py), on the run's training images, after the seed is set.
        model.reset_classifier(model.config.num_classes, init="zeros")
    else:
        model = build(variant_config(section.name, **changes), kernel)
    if model.config.num_classes != len(class_names):
        raise ConfigError(f"model.num_classes={model.config.num_classes} but the data has {len(class_names)} classes")
    model.class_names = list(class_names)
    return model


def describe_source(source: Any) -> str:
    """What the config records for a dataset given as an object: its type and size."""
    size = f", {len(source)} items" if hasattr(source, "__len__") else ""
    return f"object:{type(source).__module__.split('.')[0]}.{type(source).__name__}{size}"


def augmentation(d) -> dict[str, Any]:
    """The data section's training augmentation, as train_transform's keyword arguments."""
    return {k: getattr(d, k) for k in AUGMENT_OPTIONS}


def wrap_sources(cfg: RunConfig, model: ModelConfig, sources: tuple[Any, dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    """Datasets given as objects, with the model's preprocessing: the recipe's augmentation
    for training, the model's own eval transform (vitlab.transform) for evaluation. Training
    needs a map-style set: exact resume and many processes pick items by index."""
    d = cfg.data
    train, evals = sources
    if isinstance(train, torch.utils.data.DataLoader):
        train = train.dataset  # vitlab's own sampler sets the order and the batch
    train_set = foreign.wrap(train, data_transforms(cfg, model)[0], seed=cfg.train.seed)
    if not hasattr(train_set, "__len__") or isinstance(train_set, torch.utils.data.IterableDataset):
        raise ConfigError("training data given as a stream (an IterableDataset): give a map-style dataset (__len__, __getitem__)")
    names = train_set.class_names
    train_set = training_subset(train_set, d.train_fraction, d.train_size, d.subset_seed)
    return train_set, {split: foreign.wrap(src, data_transforms(cfg, model)[1], names) for split, src in evals.items()}


def data_transforms(cfg: RunConfig, model: ModelConfig) -> tuple[Any, Any]:
    """(training, evaluation) transforms of a run: the model's preprocessing with the recipe's
    augmentation, decoded as data.decode and data.eval_decode say (vitlab.data.decode). The
    training images come out uint8 (unless an augmentation runs on the normalised image); the
    trainer normalises them on its device (decode.model_input)."""
    d = cfg.data
    try:
        train = model_transform(model, train=True, antialias=d.antialias, decode=d.decode, uint8=True, **augmentation(d))
    except ValueError as e:  # an augmentation data.decode=cuda cannot run
        raise ConfigError(f"data.decode={d.decode}: {e}") from None
    return train, (fast_model_transform(model, d.antialias) if d.eval_decode == "fast" else
                   model_transform(model, antialias=d.antialias))


def open_datasets(cfg: RunConfig, model: ModelConfig, sources: Optional[tuple[Any, dict[str, Any]]],
                  inputs: Inputs) -> tuple[Any, dict[str, Any]]:
    """(training set, {evaluation split: dataset}) with the model's preprocessing, from the
    config's data specs (each split opened once in `inputs`) or from `sources` (objects; see
    wrap_sources); the training set cut to data.train_fraction / data.train_size (a fixed,
    balanced subset)."""
    if sources is not None:
        return wrap_sources(cfg, model, sources)
    d = cfg.data
    training, evaluation = data_transforms(cfg, model)
    train = training_split(cfg, training, True, inputs)
    return train, {s: open_split(cfg, d.eval_data or d.name, s, evaluation, False, inputs) for s in d.eval_splits}


def training_split(cfg: RunConfig, transform: Any, train: bool, inputs: Inputs) -> Any:
    """The run's training split and subset (data.train_fraction / data.train_size) through `transform`."""
    d = cfg.data
    subset = None if d.train_fraction == 1 and not d.train_size else (d.train_fraction, d.train_size, d.subset_seed)
    return open_split(cfg, d.name, d.train_split, transform, train, inputs, subset)


def open_split(cfg: RunConfig, spec: str, split: str, transform: Any, train: bool, inputs: Inputs,
               subset: Optional[tuple[float, int, int]] = None) -> Any:
    """One split of a data spec with the run's data options (dev fraction, bad images, shuffle
    buffer, a wds set's class list), opened once in `inputs`."""
    options = DataOptions.of(cfg.data)
    if not spec.startswith("wds:"):
        options = dataclasses.replace(options, classes=())  # data.classes names a wds set's classes only
    return inputs.split(spec, split, transform, train=train, seed=cfg.train.seed, options=options, subset=subset)


def plain_training_set(cfg: RunConfig, model: ModelConfig, sources: Optional[tuple[Any, dict[str, Any]]],
                       inputs: Inputs) -> Any:
    """The run's training images (its split and subset) at the evaluation transform: no
    augmentation, the full decode. What model.head_start=probe fits the new head on."""
    d, evaluate = cfg.data, model_transform(model, antialias=cfg.data.antialias)
    if sources is not None:
        train = sources[0].dataset if isinstance(sources[0], torch.utils.data.DataLoader) else sources[0]
        images = foreign.wrap(train, evaluate, seed=cfg.train.seed)
        return training_subset(images, d.train_fraction, d.train_size, d.subset_seed)
    return training_split(cfg, evaluate, False, inputs)


def train_loader(cfg: RunConfig, train_set: Any, batch: int, start: int, total: int, ctx: Any) -> Iterator:
    """The run's training batches of global steps [start, total) for this process, pinned when
    the device is CUDA (uint8 batches go to it and are normalised there: `model_input`)."""
    if cfg.data.decode == "cuda" and ctx.device.type != "cuda":
        raise ConfigError(f"data.decode=cuda decodes on a CUDA device, and this run is on {ctx.device}; "
                          "use data.decode=fast")
    return iter(make_loader(
        train_set, batch, seed=cfg.train.seed, rank=ctx.rank, world=ctx.world, train=True, start_step=start,
        num_steps=total - start, num_workers=cfg.data.num_workers, pin_memory=ctx.device.type == "cuda",
    ))
