"""A sweep's results: one row per cell, results.csv, and the numbers behind each figure.

A row holds the cell's axis values, its folder and status, the train summary flattened
(`test.top1`, `steps`, `compute.train_flops`, ...; a split's metrics lose the `splits.`
prefix) and each after-step's JSON under the step's name (`fewshot.shots.5.mean`). Lists of
numbers stay lists (a value per layer, per seed); results.csv writes them as JSON.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

from vitlab.config import ConfigError
from vitlab.config.sweep import FigureSpec
from vitlab.files import atomic_write_text, documents
from vitlab.run_layout import SUMMARY_SHAPE
from vitlab.sweep.cells import Cell, check_record
from vitlab.tables import csv_table

SKIP = ("per_class", "confusion")  # per-class tables: too wide for a results row


def _numbers(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)


def _table(v: Any) -> bool:
    return isinstance(v, list) and all(_numbers(r) for r in v)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            if k in SKIP:
                continue
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    key = prefix[:-1]
    if isinstance(d, list):
        if _numbers(d):
            out[key] = d
        elif _table(d):
            out[key] = [sum(r) / len(r) if r else float("nan") for r in d]  # a table (layer x head): row means
        return out  # deeper (maps of a map per position, images): not a results column
    if d is None or isinstance(d, (int, float, str, bool)):
        out[key] = d
    return out


def _records(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def columns_only(d: Any) -> Any:
    """`d` without what flatten() leaves out (the per-class tables, and lists deeper than a
    table: a position-similarity grid of grids, rollout maps per image): the part of a cell's
    JSON that its results row is built from, so a copy of it rebuilds the same row. A list of
    records (a random-init null's draws, each with its own summary) is kept, each record
    trimmed the same way: no column reads it, but it is what a column's mean was taken over."""
    if isinstance(d, dict):
        return {k: columns_only(v) for k, v in d.items()
                if k not in SKIP and (not isinstance(v, list) or _numbers(v) or _table(v) or _records(v))}
    if _records(d):
        return [columns_only(x) for x in d]
    return d


def read_json(path: Path, step: str = "") -> Optional[Any]:
    """A step's result file (None when it has none), read back through files.documents: one
    that is damaged, or a train summary whose metrics are not numbers, is refused by name."""
    if not (path.exists() or path.is_symlink()):
        return None
    shape = SUMMARY_SHAPE if step == "train" else object
    return documents.read_json(path, shape, f"{step or 'step'} result",
                               "delete it to run the step again (rerun the sweep)", ConfigError)


def check_finite(results: dict[str, Any], path: Path) -> None:
    """A NaN or infinite result is refused by name: left in, it would drop out of its arm's
    statistics unseen (value() reads it as missing) and change n without a word."""
    for key, v in results.items():
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, float) and not math.isfinite(x):
                raise ConfigError(f"{path}: {key} is {x}, not a finite number; delete the file and rerun the sweep")


def cell_row(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    row: dict[str, Any] = {**cell.labels, "cell": cell.key}
    done = 0
    for step in cell.steps:
        data = read_json(cell_dir / step.result, step.name)
        if data is None:
            continue
        done += 1
        if step.name == "train":
            splits = data.pop("splits", {}) if isinstance(data, dict) else {}
            results = {**flatten(splits), **flatten(data)}
        else:
            results = flatten(data, f"{step.name}.")
        check_finite(results, cell_dir / step.result)
        # A cell's grid labels are what its arms and compared pairs are found by: a result of
        # the same name (train's summary.json has `model`, the model's description) goes
        # under its step's name instead of overwriting the label.
        row.update({(f"{step.name}.{k}" if k in cell.labels else k): v for k, v in results.items()})
    row["status"] = "done" if done == len(cell.steps) else ("partial" if done else "missing")
    return row


def collect(cells: list[Cell], out: Path) -> list[dict[str, Any]]:
    """A row per cell, each cell's folder checked to hold that cell's work first (its cell.json,
    cells.check_record): a cell finished with other settings is refused, never tabulated."""
    rows = []
    for c in cells:
        cell_dir = check_record(c, out)
        if not (cell_dir / "cell.json").exists() and any((cell_dir / s.result).exists() for s in c.steps):
            raise ConfigError(f"{cell_dir} holds results but no cell.json; delete the folder to run the cell again")
        rows.append(cell_row(c, cell_dir))
    return rows


def write_csv(rows: list[dict[str, Any]], axes: list[str], path: Path) -> Path:
    columns = [*axes, "cell", "status"]
    for row in rows:
        columns += [k for k in row if k not in columns]
    cells = [[json.dumps(v) if isinstance(v, list) else v for v in (row.get(k) for k in columns)] for row in rows]
    atomic_write_text(path, csv_table(columns, cells))  # the one table writer (vitlab.tables)
    return path


# The numbers behind a figure ----------------------------------------------------------------
def number(v: Any) -> Optional[float]:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


_ITEM = re.compile(r"(.+)\[(-?\d+)\]")


def value(row: dict[str, Any], column: str) -> Optional[float]:
    """A results column's number, `A - B` of two columns (a score minus its baseline:
    `fewshot.shots.5.mean - init.shots.5.mean`), or one entry of a list column, counted from 0
    (`...mean_per_layer[0]`, the first layer; `[-1]`, the last); None when a side is missing."""
    if " - " in column:
        a, b = (value(row, c.strip()) for c in column.split(" - ", 1))
        return None if a is None or b is None else a - b
    item = _ITEM.fullmatch(column)
    if item:
        values, i = row.get(item[1]), int(item[2])
        return number(values[i]) if isinstance(values, list) and -len(values) <= i < len(values) else None
    return number(row.get(column))


def selected(rows: list[dict[str, Any]], fig: FigureSpec) -> list[dict[str, Any]]:
    return [r for r in rows if r["status"] != "missing" and all(str(r.get(k)) == str(v) for k, v in fig.where.items())]


def groups(rows: list[dict[str, Any]], fig: FigureSpec) -> dict[str, list[tuple[Any, list[float]]]]:
    """series label -> [(x, the y of every cell at that x)], x in the order first seen (or
    sorted when numeric). Cells differing only in axes not drawn (seeds) share an x."""
    by: dict[str, dict[Any, list[float]]] = defaultdict(dict)
    for row in selected(rows, fig):
        y, x = value(row, fig.y), row.get(fig.x)
        if y is None or x is None:
            continue
        by[str(row.get(fig.series, "")) if fig.series else fig.y].setdefault(x, []).append(y)
    out = {}
    for label, points in by.items():
        items = list(points.items())
        if all(number(x) is not None for x, _ in items):
            items.sort(key=lambda p: number(p[0]) or 0.0)  # (every one a number: checked above)
        out[label] = items
    return out


def curves(rows: list[dict[str, Any]], fig: FigureSpec) -> dict[str, list[list[float]]]:
    """series label -> the list-valued y of every cell (a curve per cell, e.g. per seed)."""
    by: dict[str, list[list[float]]] = defaultdict(list)
    for row in selected(rows, fig):
        y = row.get(fig.y)
        if isinstance(y, list) and y:
            by[str(row.get(fig.series, "")) if fig.series else fig.y].append([float(v) for v in y])
    return dict(by)


def references(rows: list[dict[str, Any]], fig: FigureSpec) -> dict[str, Any]:
    """label -> the mean over the figure's cells of a reference column: a number, or a list
    averaged per index (a curve)."""
    out: dict[str, Any] = {}
    for label, column in fig.references.items():
        values = [r.get(column) for r in selected(rows, fig) if r.get(column) is not None]
        lists = [v for v in values if isinstance(v, list) and v]
        nums = [n for n in (number(v) for v in values if not isinstance(v, list)) if n is not None]
        if lists:
            n = min(len(v) for v in lists)
            out[label] = [sum(float(v[i]) for v in lists) / len(lists) for i in range(n)]
        elif nums:
            out[label] = sum(nums) / len(nums)
    return out


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no cheaper-or-equal point beats: sorted by x (cost), each with a y (score)
    higher than every point left of it. Fig. 5's fronts of accuracy against compute."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front
