"""`vitlab sweep`: a grid of training runs, the commands after each, results.csv and figures.

    from vitlab.config.sweep import load_sweep
    from vitlab import sweep
    spec, _ = load_sweep("paper/pos-embed")
    summary = sweep.run_sweep(spec, Path("runs/sweeps/pos-embed"), jobs=2)

The spec format is described in vitlab/config/sweep.py; cells in cells.py, launching in
runner.py, results in results.py. A sweep can be stopped at any time and run again: finished
cells are skipped and an interrupted one resumes from its newest checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from vitlab.analysis import sweep_plots
from vitlab.config import ConfigError
from vitlab.config.sweep import FigureSpec, SweepSpec, check_controls, claims_digest
from vitlab.data import remote
from vitlab.files import OutputFolder, atomic_write_text
from vitlab.files.documents import Number, read_json
from vitlab.sweep import declare, findings, results as res
from vitlab.sweep.cells import MAX_CELLS, Cell, check_record, count, expand, too_many
from vitlab.sweep.runner import LAUNCHERS, Say, check_launcher, redo_step, run

__all__ = ["LAUNCHERS", "Cell", "claims_declared", "draw", "dry_run", "expand", "load_folder", "run_sweep"]

SPEC_FILE = "sweep.json"  # in a sweep's folder: the spec and --scale it was run with


def draw(fig: FigureSpec, rows: list[dict[str, Any]], out: Path) -> Optional[Path]:
    """One figure of the spec, or None when no finished cell has its numbers yet."""
    path = out / fig.file
    labels: dict[str, Any] = dict(title=fig.title, xlabel=fig.xlabel or fig.x, ylabel=fig.ylabel or fig.y, logy=fig.logy)
    if fig.kind == "curve":
        curves = res.curves(rows, fig)
        refs = res.references(rows, fig)
        return sweep_plots.plot_curves(curves, path, **{**labels, "xlabel": fig.xlabel or "index"},
                                       references=refs) if curves else None
    groups = res.groups(rows, fig)
    if not groups:
        return None
    if fig.kind == "line":
        return sweep_plots.plot_lines(groups, path, logx=fig.logx, **labels)
    if fig.kind == "bar":
        return sweep_plots.plot_bars(groups, path, **labels)
    fronts = {}
    for label, pts in groups.items():
        # the front of the means over seeds at each x (one model at one budget), as plotted
        points = [(n, sum(ys) / len(ys)) for x, ys in pts if (n := res.number(x)) is not None and ys]
        fronts[label] = res.pareto_front(points)
    return sweep_plots.plot_pareto(groups, fronts, path, logx=fig.logx, **labels)


def save_spec(spec: SweepSpec, out: Path, scale: float, source: Optional[Path] = None, stamp: bool = False,
              redo: str = "") -> Path:
    """The spec and scale of a sweep, kept in its folder so `vitlab sweep --report DIR` can
    rebuild the report from the cells alone, with its declared claims' record (declare.record:
    digest and text; with `stamp`, before the first cell runs, the time and the spec's commit;
    with `redo`, the after-step recomputed on finished cells: declare.redone)."""
    out.mkdir(parents=True, exist_ok=True)
    claims = declare.record(spec, recorded_claims(out), stamp, source)
    if redo:
        claims = declare.redone(spec, claims, redo)
    atomic_write_text(out / SPEC_FILE, json.dumps({"spec": spec.to_dict(), "scale": scale, "claims": claims}, indent=2))
    return out / SPEC_FILE


SPEC_SHAPE = {"spec": dict, "scale?": Number(0, integer=False), "claims?": dict}  # sweep.json, as files.documents checks it


def recorded_claims(out: Path) -> Optional[dict[str, Any]]:
    """A sweep folder's declaration record (its sweep.json's `claims`), None when absent."""
    if not (out / SPEC_FILE).is_file():
        return None
    d = read_json(out / SPEC_FILE, SPEC_SHAPE, "sweep's spec", f"delete {out / SPEC_FILE}", ConfigError)
    return d.get("claims") or None


def claims_declared(spec: SweepSpec, out: Path, cells: list[Cell]) -> dict[str, Any]:
    """When `spec`'s claims were declared, as the record in `out` proves it (declare.verify)."""
    return declare.verify(spec, recorded_claims(out), out, [out / c.key for c in cells])


def load_folder(out: Path) -> tuple[SweepSpec, float]:
    """The spec and scale a sweep folder was run with (its sweep.json)."""
    path = out / SPEC_FILE
    if not (path.exists() or path.is_symlink()):
        raise ConfigError(f"{out} has no {SPEC_FILE} (not a sweep folder): name the spec too, vitlab sweep SPEC --out {out} --report")
    d = read_json(path, SPEC_SHAPE, "sweep's spec", f"name the spec: vitlab sweep SPEC --out {out} --report", ConfigError)
    try:
        return SweepSpec.from_dict(d["spec"], d["spec"].get("name") or out.name), float(d.get("scale", 1.0))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}; name the spec: vitlab sweep SPEC --out {out} --report") from None


def check_claims(spec: SweepSpec, out: Path, cells: list[Cell]) -> None:
    """Refuse a spec whose declared claims differ from those its folder's results were run
    under: a claim is set before the run, so a changed one needs a new run (another --out)."""
    if not (out / SPEC_FILE).is_file() or not any((out / c.key / "cell.json").is_file() for c in cells):
        return
    old, _ = load_folder(out)
    if claims_digest(old) != claims_digest(spec):
        raise ConfigError(f"{out} holds results run under other declared claims than {spec.name}'s now (a claim is declared "
                          "before its run): run the changed spec into a new --out, or restore its claims")


def check_commands(cell: Cell, spec: SweepSpec) -> None:
    """A `pipe:` data spec in a cell's commands comes from the spec file: the cells' processes
    would see it typed on their command lines, so it is allowed (or refused) here, once, by
    the rule of the sweep's own command line (vitlab.data.remote.check_command)."""
    for step in cell.steps:
        for command in remote.typed_commands(step.argv):
            remote.check_command(command, f"sweep {spec.name}, cell {cell.key}, step {step.name}")


def report(spec: SweepSpec, cells: list[Cell], out: Path, say: Say = print) -> dict[str, Any]:
    """Collect every cell's results into results.csv, the statistics into report.md and
    report.json, and draw the spec's figures."""
    rows = res.collect(cells, out)
    csv = res.write_csv(rows, list(spec.grid), out / "results.csv")
    js, md = findings.write(spec, rows, out, findings.build(spec, rows, claims_declared(spec, out, cells)))
    drawn = [p for p in (draw(f, rows, out) for f in spec.figures) if p is not None]
    done = sum(r["status"] == "done" for r in rows)
    say(f"results: {csv} ({done} of {len(rows)} cells finished)")
    say(f"report:  {md} and {js.name}")
    for p in drawn:
        say(f"figure:  {p}")
    return {"rows": rows, "csv": csv, "report": md, "figures": drawn, "finished": done, "cells": len(rows)}


def dry_run(spec: SweepSpec, out: Path, scale: float = 1.0, max_cells: int = MAX_CELLS) -> list[str]:
    """What `vitlab sweep --dry-run` prints: the number of cells at once (counted, not made),
    then each cell's commands when the grid is within `max_cells`; runs nothing."""
    n = count(spec)
    lines = [f"sweep {spec.name}: {n:,} cell(s) -> {out}", *declare.plan_lines(spec)]
    if n > max_cells:
        return lines + [f"not listed: {too_many(n, max_cells)}"]
    for cell in expand(spec, out, scale, max_cells):
        lines += [f"{cell.key}:", *(f"  vitlab {' '.join(step.argv)}" for step in cell.steps)]
    return lines


def run_sweep(spec: SweepSpec, out: Path, *, scale: float = 1.0, jobs: int = 1, threads: int = 0,
              launcher: str = "local", params: Optional[dict[str, Any]] = None, wait: bool = True,
              report_only: bool = False, max_cells: int = MAX_CELLS, say: Say = print,
              source: Optional[Path] = None, redo: str = "") -> dict[str, Any]:
    """Run (or with report_only, only report) a sweep; `source` is the spec's file, whose git
    commit the declaration records (declare.committed). `redo`: the after-step of that name is
    run again in every finished cell, with the spec's command now (runner.redo_step), and the
    claims that read it are recorded as post hoc (declare.redone)."""
    cells = expand(spec, out, scale, max_cells)
    if redo and report_only:
        raise ConfigError(f"--redo-after {redo} runs a step; --report runs nothing: give one")
    if redo and not redo_step(cells, spec, out, redo):
        redo = ""  # every cell already records the step's command: nothing is recomputed
    # The sweep folder may be one the user keeps files in: its own tables and figures only. A
    # folder that holds this sweep's cells (their cell.json) or its sweep.json is the sweep's.
    mine = (out / SPEC_FILE).is_file() or any((out / c.key / "cell.json").is_file() for c in cells)
    owner = OutputFolder(out, "sweep", force=mine, offer_force=False)
    owner.claim(["results.csv", "report.json", "report.md", SPEC_FILE, *(f.file for f in spec.figures)])
    if not report_only:  # refused before anything is written: a launcher this machine lacks, another cell's folder
        check_launcher(launcher)
        for cell in cells:
            check_record(cell, out)
            check_commands(cell, spec)
        declare.check_power(spec)
        check_controls(spec)
    check_claims(spec, out, cells)
    started = any((out / c.key / "cell.json").is_file() for c in cells)
    save_spec(spec, out, scale, source, stamp=not report_only and not started, redo=redo)
    ran = None
    if not report_only:
        ran = run(cells, spec, out, jobs=jobs, threads=threads, launcher=launcher, params=params, wait=wait, say=say)
        if ran is None:  # submitted, not waited for: `vitlab sweep SPEC --report` collects later
            return {"submitted": True, "cells": len(cells)}
    summary = report(spec, cells, out, say)
    owner.record([summary["csv"].name, "report.json", "report.md", SPEC_FILE, *(p.name for p in summary["figures"])])
    summary["failed"] = [r for r in (ran or []) if r["status"] != "done"]
    return summary
