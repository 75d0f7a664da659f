"""Configuration as plain frozen dataclasses, split by concern:

- `model.py`: the networks (`ViTConfig`, the hybrid's `ResNetConfig`, the `BiTConfig` ResNet
  baseline) and their FLOP count;
- `run.py`: a training run (`RunConfig`: model, data, optim, train and objective sections),
  recipes and `key=value` overrides;
- `provenance.py`: which layer set each value of a run (a typed `Origin`), and the layers' form
  in a run's config.yaml;
- `mpp.py`: masked patch prediction's options;
- `preprocessing.py`: the evaluation preprocessing as numbers and words (`eval_recipe`), what
  vitlab.transform runs and an ONNX file's metadata states;
- `sweep.py`: a sweep's spec (`SweepSpec`: the grid, the after-steps, the figures);
- `serve.py`: how `vitlab serve` listens, batches and bounds its uploads;
- `device.py`: which device a setting names, and whether this machine has it;
- `fields.py`: what they share: `ConfigError`, one type-and-rule check per field, one
  unknown-key check.

Everything is importable from `vitlab.config`. This package imports nothing else of vitlab.
"""

from vitlab.config.device import pick_device
from vitlab.config.fields import ConfigError
from vitlab.config.model import (
    BIT_STEMS,
    CLASSIFIERS,
    CONFIG_KINDS,
    GELUS,
    HEAD_INITS,
    POS_EMBEDS,
    RESIZE_MODES,
    WS_MODES,
    BiTConfig,
    ModelConfig,
    ResNetConfig,
    ViTConfig,
    bit_flops,
    config_from_dict,
    config_kind,
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
    STOP_SIGNALS,
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
from vitlab.config.sweep import AfterStep, FigureSpec, SweepSpec, load_sweep, shipped_sweeps

__all__ = ["AfterStep", "FigureSpec", "SweepSpec", "load_sweep", "shipped_sweeps",
           "BIT_STEMS", "BiTConfig", "CONFIG_KINDS", "ModelConfig", "bit_flops", "config_from_dict", "config_kind",
           "CLASSIFIERS", "DECAYS", "GELUS", "HEAD_INITS", "MPP_TARGETS", "OBJECTIVE_OPTIONS", "OPTIMIZERS", "PARALLEL",
           "POS_EMBEDS", "PRECISIONS", "STOP_SIGNALS", "RESIZE_MODES", "WS_MODES", "ConfigError", "pick_device", "DataConfig", "MPPConfig", "ModelSection",
           "NoOptions", "OptimConfig", "ResNetConfig", "RunConfig", "ServeConfig", "TrainConfig", "ViTConfig", "load_recipe",
           "model_flops", "parse_override", "resnet_flops", "shipped_recipes"]
