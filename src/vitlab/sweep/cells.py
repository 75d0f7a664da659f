"""A sweep's cells: the product of its axes, each a list of command lines.

A cell is a folder of the sweep's output:

    OUT/<cell>/cell.json   the cell's axis values and the exact commands it runs
    OUT/<cell>/train/      the `vitlab train` run folder (config, checkpoints, summary.json)
    OUT/<cell>/*.json      what the after-steps write
    OUT/<cell>/*.log       each step's output

Each step is a `vitlab` command line, so a cell depends on the command line alone, never on
the trainer's internals. A step is done when its result file exists; an interrupted train
step is the same command into the same run folder, which the trainer resumes.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vitlab.config import ConfigError
from vitlab.config.sweep import SweepSpec
from vitlab.run_layout import RunLayout

TRAIN_RESULT = "train/summary.json"
TRAIN = "train"  # the cell's training run: CELL/train, a run folder (vitlab.run_layout)
BEST = "best.safetensors"  # with train.keep_best, in the run's checkpoints folder
TAG = "tag."


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]  # after `vitlab`
    result: str  # relative to the cell folder


@dataclass(frozen=True)
class Cell:
    key: str  # the folder name
    labels: dict[str, Any]  # axis -> the value (or bundle label) of this cell
    settings: dict[str, Any]  # every train setting, shared and from the axes
    steps: tuple[Step, ...]

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.labels.items()) or "(single cell)"


def _word(value: Any) -> str:
    """A value as a folder-name piece: ViT-C/4 -> ViT-C-4, 0.001 -> 0.001, [1, 2] -> 1-2."""
    if isinstance(value, (list, tuple)):
        return "-".join(_word(v) for v in value)
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", str(value)).strip("-") or "x"


def _axis_word(axis: str) -> str:
    return axis.split(".")[-1].replace("_", "-")


def _scaled(value: Any, scale: float, key: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"scale: {key}={value!r} is not a number, so --scale cannot multiply it")
    if isinstance(value, int):
        return max(1, round(value * scale))
    return value * scale


def flag_argv(settings: dict[str, Any]) -> list[str]:
    """Settings as `vitlab train` arguments: `key: v` -> `--key v` (true -> `--key`, false ->
    nothing), `section.key: v` -> `section.key=v` (the value written as YAML)."""
    flags, overrides = [], []
    for key, value in settings.items():
        if "." in key:
            text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
            overrides.append(f"{key}={text.removesuffix(chr(10) + '...')}")
        elif value is True:
            flags.append(f"--{key.replace('_', '-')}")
        elif value is not False and value is not None:
            flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags + overrides


def _fill(command: str, cell_dir: Path, scale: float) -> tuple[str, ...]:
    run = RunLayout(cell_dir / TRAIN)
    words = {"checkpoint": str(run.last), "best": str(run.checkpoint_file(BEST)), "run": str(run.path),
             "cell": str(cell_dir)}

    def one(m: re.Match) -> str:
        name, _, arg = m.group(1).partition(":")
        if name == "scaled":
            return str(max(1, round(float(arg) * scale)))
        if name not in words:
            raise ConfigError(f"after: unknown placeholder {{{name}}} in {command!r}; known: checkpoint, best, run, cell, scaled:N")
        return words[name]

    return tuple(re.sub(r"\{([a-z]+(?::[0-9.]+)?)\}", one, w) for w in shlex.split(command))


def expand(spec: SweepSpec, out: Path, scale: float = 1.0) -> list[Cell]:
    """Every cell of the grid, in the order the axes are written (the last varies fastest)."""
    axes = []
    for axis, values in spec.grid.items():
        if isinstance(values, dict):
            axes.append([(axis, label, dict(bundle)) for label, bundle in values.items()])
        else:
            axes.append([(axis, v, {axis: v}) for v in values])
    cells, seen = [], {}
    for combo in itertools.product(*axes) if axes else [()]:
        settings, labels = dict(spec.train), {}
        for axis, label, bundle in combo:
            labels[axis] = label
            for k, v in bundle.items():  # `tag.NAME: value` labels the cell (a figure's series), trains nothing
                if k.startswith(TAG):
                    labels[k[len(TAG):]] = v
                else:
                    settings[k] = v
        for key in spec.scale:
            if key in settings:
                settings[key] = _scaled(settings[key], scale, key)
        key = "_".join(f"{_axis_word(a)}-{_word(label)}" for a, label, _ in combo) or "single"
        if key in seen:
            raise ConfigError(f"grid: cells {seen[key]} and {labels} get the same folder name {key!r}; make the values distinct")
        seen[key] = labels
        cell_dir = out / key
        train = Step("train", ("train", *flag_argv(settings), "--out", str(cell_dir / TRAIN)), TRAIN_RESULT)
        after = tuple(Step(a.name, _fill(a.command, cell_dir, scale), a.result) for a in spec.after)
        cells.append(Cell(key, labels, settings, (train, *after)))
    return cells
