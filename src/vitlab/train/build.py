"""What a run trains: the network its model section names, and the datasets it reads."""

from __future__ import annotations

from typing import Any

import torch

from vitlab import checkpoints
from vitlab.config import ConfigError, ModelSection, RunConfig, ViTConfig
from vitlab.data import open_dataset
from vitlab.models.variants import variant_config
from vitlab.models.vit import VisionTransformer


def architecture(section: ModelSection) -> ViTConfig:
    """The network a run trains, before the class count is known: a registered variant, or
    the one a start checkpoint holds, with the section's changes."""
    if section.checkpoint:
        return checkpoints.read_checkpoint(section.checkpoint).config.replace(**section.changes)
    return variant_config(section.name, **section.changes)


def build_model(section: ModelSection, class_names: list[str]) -> VisionTransformer:
    changes = {"num_classes": len(class_names), **section.changes}
    if section.checkpoint:
        # Fine-tuning (§3.2): position embeddings resized to the new resolution, the head
        # replaced when the class count changes, pre-logits dropped with representation_size=None.
        model = checkpoints.load(section.checkpoint, **changes)
        model.reset_classifier(model.config.num_classes, init="zeros")  # a fresh zero head, always
    else:
        model = VisionTransformer(variant_config(section.name, **changes))
    if model.config.num_classes != len(class_names):
        raise ConfigError(f"model.num_classes={model.config.num_classes} but the data has {len(class_names)} classes")
    model.class_names = list(class_names)
    return model


def fresh_model(config: ViTConfig) -> VisionTransformer:
    """A model to copy weights into. Built with the random state put back afterwards: its
    initialisation must not shift the run's random stream (exact resume)."""
    with torch.random.fork_rng(devices=[]):
        return VisionTransformer(config)


def open_datasets(cfg: RunConfig, model: ViTConfig) -> tuple[Any, dict[str, Any]]:
    """(training set, {evaluation split: dataset}) with the model's preprocessing."""
    d = cfg.data
    options: dict[str, Any] = dict(
        crop_scale=d.crop_scale, crop_ratio=d.crop_ratio, hflip=d.hflip, randaugment=d.randaugment,
        randaugment_magnitude=d.randaugment_magnitude, dev_fraction=d.dev_fraction,
        skip_bad_images=d.skip_bad_images, shuffle_buffer=d.shuffle_buffer,
    )

    def open_split(spec: str, split: str, train: bool):
        extra = {"classes": list(d.classes)} if spec.startswith("wds:") and d.classes else {}
        return open_dataset(
            spec, split, image_size=model.image_size, in_channels=model.in_channels, mean=model.mean, std=model.std,
            train=train, seed=cfg.train.seed, **options, **extra,
        )

    eval_spec = d.eval_data or d.name
    return open_split(d.name, d.train_split, True), {s: open_split(eval_spec, s, False) for s in d.eval_splits}
