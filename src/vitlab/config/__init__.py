"""Configuration as plain frozen dataclasses, split by concern:

- `model.py`: the network (`ViTConfig`, the hybrid's `ResNetConfig`) and its FLOP count;
- `run.py`: a training run (`RunConfig`: model, data, optim, train and objective sections),
  recipes and `key=value` overrides;
- `mpp.py`: masked patch prediction's options;
- `serve.py`: how `vitlab serve` listens, batches and bounds its uploads;
- `fields.py`: what they share: `ConfigError`, one type-and-rule check per field, one
  unknown-key check.

Everything is importable from `vitlab.config`. This package imports nothing else of vitlab.
"""

from vitlab.config.fields import ConfigError
from vitlab.config.model import (
    CLASSIFIERS,
    GELUS,
    HEAD_INITS,
    POS_EMBEDS,
    RESIZE_MODES,
    WS_MODES,
    ResNetConfig,
    ViTConfig,
    model_flops,
    resnet_flops,
)
from vitlab.config.mpp import MPP_TARGETS, MPPConfig
from vitlab.config.run import (
    DECAYS,
    OBJECTIVE_OPTIONS,
    OPTIMIZERS,
    PARALLEL,
    PRECISIONS,
    DataConfig,
    ModelSection,
    NoOptions,
    OptimConfig,
    RunConfig,
    TrainConfig,
    load_recipe,
    parse_override,
    shipped_recipes,
)
from vitlab.config.serve import ServeConfig

__all__ = [
    "CLASSIFIERS", "DECAYS", "GELUS", "HEAD_INITS", "MPP_TARGETS", "OBJECTIVE_OPTIONS", "OPTIMIZERS", "PARALLEL",
    "POS_EMBEDS", "PRECISIONS", "RESIZE_MODES", "WS_MODES", "ConfigError", "DataConfig", "MPPConfig", "ModelSection",
    "NoOptions", "OptimConfig", "ResNetConfig", "RunConfig", "ServeConfig", "TrainConfig", "ViTConfig", "load_recipe",
    "model_flops", "parse_override", "resnet_flops", "shipped_recipes",
]
