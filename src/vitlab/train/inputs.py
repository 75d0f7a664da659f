"""What a plan's runs read, read once: the recipe, the start checkpoint and the config.yaml of
the run that wrote it, each data split, each probe head.

A fine-tune is many runs of one plan: the sweep's arms, the final run, the repeats; a VTAB
row is every task's. Each run used to read the checkpoint and open the data from their names
again (a default fine-tune read its checkpoint 16 times and opened datasets 19 times).
`Inputs` is made once per command and handed to every run of the plan, always: no run makes
its own behind a caller's back (`Trainer(config, out, inputs)`; `vitlab train` passes a new
one for its one run). The recipe is read once, the checkpoint once (config and weights held
in memory), each data source once (`held`), each split of a data spec opened once and read
by each run through its own transform and seed (a view: nothing is read again), and a probe
head (model.head_start=probe) is fitted once per split
and model, then copied into every run that starts from it.

Nothing held here changes: a run builds its model from a copy of the weights, and a dataset
view shares the opened storage but has its own transform.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from vitlab import checkpoints
from vitlab.checkpoints.io import Imported
from vitlab.config import ConfigError, RunConfig, load_recipe
from vitlab.data import DataOptions, open_dataset, training_subset
from vitlab.data.open import DEV_SPLITS, carves_dev, dev_part
from vitlab.run_layout import holding_run
from vitlab.train.run_folder import RunFolder


def _raw(image: Any) -> Any:
    """The transform a split is opened with: runs read it through views with their own."""
    return image


@dataclass
class Inputs:
    """The recipes, checkpoints, data splits and probe heads a plan has read, by what names them."""

    recipes: dict[str, RunConfig] = field(default_factory=dict)
    checkpoints: dict[str, Imported] = field(default_factory=dict)
    splits: dict[tuple, Any] = field(default_factory=dict)
    heads: dict[str, tuple[torch.Tensor, torch.Tensor, dict[str, Any]]] = field(default_factory=dict)
    held: dict[tuple, Any] = field(default_factory=dict)  # sources read into memory, for every split of them
    source_configs: dict[str, Optional[RunConfig]] = field(default_factory=dict)

    def recipe(self, name: str) -> RunConfig:
        """A recipe (a shipped name or a file: load_recipe), read on first use."""
        if name not in self.recipes:
            self.recipes[name] = load_recipe(name)
        return self.recipes[name]

    def source_config(self, checkpoint: str) -> Optional[RunConfig]:
        """The config.yaml of the vitlab run that wrote `checkpoint` (RUN/checkpoints/FILE), read
        on first use; None for a file outside a run folder, a name, or an unreadable config."""
        if checkpoint not in self.source_configs:
            run = holding_run(checkpoint)
            try:
                found = RunFolder(run.path).read_config() if run is not None and run.config.is_file() else None
            except ConfigError:
                found = None
            self.source_configs[checkpoint] = found
        return self.source_configs[checkpoint]

    def checkpoint(self, path: str) -> Imported:
        """The checkpoint (a file or a published name), read on first use."""
        key = str(path)
        if key not in self.checkpoints:
            self.checkpoints[key] = checkpoints.read_checkpoint(key)
        return self.checkpoints[key]

    def split(self, spec: str, split: str, transform: Callable, *, train: bool, seed: int, options: DataOptions,
              subset: Optional[tuple[float, int, int]] = None) -> Any:
        """One split of a data spec through `transform`, opened on first use and then viewed;
        `subset` (fraction, size, seed): a fixed, class-balanced part of it (training_subset)."""
        key = (spec, split, options, subset)
        if key not in self.splits:
            if subset is not None:
                whole = self.split(spec, split, _raw, train=False, seed=0, options=options)
                opened = training_subset(whole, *subset)
            elif split in DEV_SPLITS and carves_dev(spec):  # a selection of the opened training split
                opened = dev_part(self.split(spec, "train", _raw, train=False, seed=0, options=options),
                                  split, options.dev_fraction)
            else:
                opened = open_dataset(spec, split, _raw, options=options, held=self.held)
            if hasattr(opened, "hold"):
                opened.hold()  # a streamed part (dev, train-minus-dev, a subset) kept once, for every view
            self.splits[key] = opened
        return self.splits[key].view(transform, seed=seed, train=train)

    def probe_head(self, key: dict[str, Any], fit: Callable[[], tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]
                   ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any], bool]:
        """(weight, bias, how it was fitted, fitted now) of the probe head `key` names (the
        model, the data split and subset, the fit's settings): fitted on first use."""
        name = json.dumps(key, sort_keys=True, default=str)
        fitted_now = name not in self.heads
        if fitted_now:
            self.heads[name] = fit()
        weight, bias, info = self.heads[name]
        return weight, bias, info, fitted_now
