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

import functools
import itertools
import json
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from vitlab.config import ConfigError
from vitlab.config.sweep import SweepSpec
from vitlab.files import MAX_NAME_BYTES, UnsafeNameError, child, to_name
from vitlab.files.documents import read_json
from vitlab.files.identity import content_digest
from vitlab.run_layout import RunLayout

TRAIN_RESULT = "train/summary.json"
TRAIN = "train"  # the cell's training run: CELL/train, a run folder (vitlab.run_layout)
BEST = "best.safetensors"  # with train.keep_best, in the run's checkpoints folder
TAG = "tag."
# The most cells a sweep runs unless --max-cells says more: a grid far larger is a typo (an
# axis of 1,000 values times three more), and a run of it would never end.
MAX_CELLS = 10_000


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
    # What makes the cell the cell it is, as its cell.json records it (`identity`): its labels,
    # its settings and the spec's after-steps.
    record: dict[str, Any] = field(default_factory=dict, compare=False)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.labels.items()) or "(single cell)"


def _word(value: Any) -> str:
    """A value as a folder-name piece: ViT-C/4 -> ViT-C-4, 0.001 -> 0.001, [1, 2] -> 1-2.
    Separators, dots that lead, and length beyond a bound never survive (files.to_name)."""
    if isinstance(value, (list, tuple)):
        return to_name("-".join(_word(v) for v in value))
    return _text_word(str(value))


@functools.lru_cache(maxsize=65536)
def _text_word(text: str) -> str:
    return to_name(text.replace("_", "-"))


def _scaled(value: Any, scale: float, key: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"scale: {key}={value!r} is not a number, so --scale cannot multiply it")
    if isinstance(value, int):
        return max(1, round(value * scale))
    return value * scale


@functools.lru_cache(maxsize=4096)
def _yaml_scalar(kind: type, value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...")


def _yaml_text(value: Any) -> str:
    """`value` as an override's YAML; scalars cached (a grid repeats each value many times)."""
    if isinstance(value, (int, float, bool)) or value is None:
        return _yaml_scalar(type(value), value)  # type: ignore[arg-type]  # a class is hashable; mypy's lru_cache check misses it
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...")


def flag_argv(settings: dict[str, Any]) -> list[str]:
    """Settings as `vitlab train` arguments: `key: v` -> `--key v` (true -> `--key`, false ->
    nothing), `section.key: v` -> `section.key=v` (the value written as YAML)."""
    flags, overrides = [], []
    for key, value in settings.items():
        if "." in key:
            overrides.append(f"{key}={value if isinstance(value, str) else _yaml_text(value)}")
        elif value is True:
            flags.append(f"--{key.replace('_', '-')}")
        elif value is not False and value is not None:
            flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags + overrides


def _fill(command: str, cell_dir: Path, scale: float, settings: dict[str, Any]) -> tuple[str, ...]:
    run = RunLayout(cell_dir / TRAIN)
    words = {"checkpoint": str(run.last), "best": str(run.checkpoint_file(BEST)), "run": str(run.path),
             "cell": str(cell_dir)}
    if "seed" in settings:  # the cell's training seed: a baseline drawn per seed pairs with it
        words["seed"] = str(settings["seed"])

    def one(m: re.Match) -> str:
        name, _, arg = m.group(1).partition(":")
        if name == "scaled":
            return str(max(1, round(float(arg) * scale)))
        if name == "seed" and name not in words:
            raise ConfigError(f"after: {command!r} uses {{seed}}, but the spec sets no seed; set it in train or grid")
        if name not in words:
            raise ConfigError(f"after: unknown placeholder {{{name}}} in {command!r}; "
                              "known: checkpoint, best, run, cell, seed, scaled:N")
        return words[name]

    return tuple(re.sub(r"\{([a-z]+(?::[0-9.]+)?)\}", one, w) for w in shlex.split(command))


def _axes(spec: SweepSpec) -> list[list[tuple[str, Any, dict]]]:
    axes = []
    for axis, values in spec.grid.items():
        if isinstance(values, dict):
            axes.append([(axis, label, dict(bundle)) for label, bundle in values.items()])
        else:
            axes.append([(axis, v, {axis: v}) for v in values])
    return axes


def count(spec: SweepSpec) -> int:
    """How many cells the grid has, without making any: the product of the axes' lengths."""
    return math.prod(len(values) for values in spec.grid.values())


def cells(spec: SweepSpec, out: Path, scale: float = 1.0) -> Iterator[Cell]:
    """The grid's cells one at a time, in the order the axes are written (the last varies
    fastest); nothing is made on disk."""
    for combo in itertools.product(*_axes(spec)):
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
        key = to_name("_".join(f"{_word(a.split('.')[-1])}-{_word(label)}" for a, label, _ in combo) or "single", MAX_NAME_BYTES)
        try:
            cell_dir = child(out, key, "grid cell")
        except UnsafeNameError as e:
            raise ConfigError(str(e)) from None
        train = Step("train", ("train", *flag_argv(settings), "--out", str(cell_dir / TRAIN)), TRAIN_RESULT)
        after = tuple(Step(a.name, _fill(a.command, cell_dir, scale, settings), a.result) for a in spec.after)
        record = {"labels": labels, "settings": settings, "after": [[a.name, a.command, a.result] for a in spec.after]}
        yield Cell(key, labels, settings, (train, *after), json.loads(json.dumps(record)))


def too_many(n: int, max_cells: int) -> str:
    return (f"grid: {n:,} cells, more than the limit of {max_cells:,}; make an axis shorter, or pass "
            f"--max-cells {n} if you mean to run them all")


def expand(spec: SweepSpec, out: Path, scale: float = 1.0, max_cells: int = MAX_CELLS) -> list[Cell]:
    """Every cell of the grid, refused before any is made when there are more than `max_cells`."""
    n = count(spec)
    if n > max_cells:
        raise ConfigError(too_many(n, max_cells))
    result: list[Cell] = []
    seen: dict[str, Any] = {}
    for cell in cells(spec, out, scale):
        if cell.key in seen:
            raise ConfigError(f"grid: cells {seen[cell.key]} and {cell.labels} get the same folder name {cell.key!r}; "
                              "make the values distinct")
        seen[cell.key] = cell.labels
        result.append(cell)
    return result


# A cell's identity, and the check that a folder holds that cell ------------------------------
CHECKPOINT_KEYS = ("model.checkpoint",)  # settings that name weights a cell starts from


def identity(cell: Cell) -> dict[str, Any]:
    """What cell.json records (files.identity's rule): the cell's record and, when its settings
    name a checkpoint file, that file's sha256 (a file replaced under the same name is another
    cell's work). A name that is no local file (a published one) counts as the name."""
    named = {k: cell.settings[k] for k in CHECKPOINT_KEYS if isinstance(cell.settings.get(k), str)}
    digests = {k: content_digest(v) for k, v in named.items() if Path(v).exists()}
    return {**cell.record, "checkpoint": digests} if digests else dict(cell.record)


def _damaged(path: Path, why: str) -> ConfigError:
    return ConfigError(f"{path} is damaged ({why}); it records which cell {path.parent.name} is: restore it, or delete "
                       f"the folder {path.parent} to run that cell again")


def check_record(cell: Cell, out: Path) -> Path:
    """The cell's folder, refused when its cell.json records another cell or other work
    (`identity`), or cannot be read. Makes nothing: the folder is made when the cell starts."""
    cell_dir = out / cell.key
    path = cell_dir / "cell.json"
    if not (path.exists() or path.is_symlink()):
        return cell_dir
    old = read_json(path, dict, "cell record", "", lambda m: _damaged(path, m[len(f"{path}: "):].rstrip("; ")))
    now = identity(cell)
    if old != now:
        changed = [k for k in now.keys() | old.keys() if now.get(k) != old.get(k)] or ["settings"]
        raise ConfigError(
            f"{cell_dir} holds cell {cell.describe()} run with other {', '.join(sorted(changed))}; its results are "
            "kept: pass another --out for the changed spec (or delete that cell's folder to rerun it)"
        )
    return cell_dir
