"""Running a sweep's cells: N processes side by side here, or each cell as a submitit job
(on Slurm, or submitit's local executor). The launchers are the standard library's thread
pool (each thread waits on one `python -m vitlab` process) and submitit; vitlab schedules
nothing itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Optional, Sequence

from vitlab.config import ConfigError
from vitlab.config.sweep import SweepSpec
from vitlab.extras import require
from vitlab.files import atomic_write_text
from vitlab.files.documents import read_json
from vitlab.sweep import slurm, timing
from vitlab.sweep.cells import Cell, Step, check_record, identity
from vitlab.train.report import DIVERGENCE_ENV

LAUNCHERS = ("local", "slurm", "submitit-local")
STOPPED = 75  # a training's exit status when a signal stopped it with a checkpoint (vitlab.train.preemption)
Say = Callable[[str], None]


def prepare(cell: Cell, spec: SweepSpec, out: Path) -> Path:
    """The cell's folder with its cell.json, made now (what `run_cell` does as the cell starts)."""
    cell_dir = check_record(cell, out)
    _record(cell_dir, identity(cell))
    return cell_dir


def _record(cell_dir: Path, record: dict[str, Any], again: bool = False) -> None:
    """The cell's cell.json (its folder made), unless it has one already (`again`: rewritten)."""
    if again or not (cell_dir / "cell.json").exists():
        cell_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cell_dir / "cell.json", json.dumps(record, indent=2))


def redo_step(cells: list[Cell], spec: SweepSpec, out: Path, name: str) -> int:
    """Prepare every cell to run its after-step `name` again with the spec's command now (a
    control drawn K times instead of once): each cell must be finished, and its cell.json may
    differ from the spec's cell only in that step. The step's result (its top file or folder
    in the cell) is deleted, then cell.json records the new command, so the sweep's own run
    makes the missing result; a cell that already records the new command is left as it is (a
    stopped redo continues). Returns how many cells were prepared. Refuses before changing any."""
    steps = [s.name for s in spec.after]
    if name not in steps:
        raise ConfigError(f"--redo-after {name}: the spec has no after-step {name!r} (its steps: {', '.join(steps) or 'none'})")
    todo = []
    for cell in cells:
        cell_dir, new = out / cell.key, identity(cell)
        path = cell_dir / "cell.json"
        unfinished = [s.name for s in cell.steps if s.name != name and not (cell_dir / s.result).exists()]
        if not path.is_file() or unfinished:
            raise ConfigError(f"--redo-after {name}: cell {cell.describe()} is not finished ({', '.join(unfinished) or 'not started'}); "
                              "run the sweep without --redo-after first")
        old = read_json(path, dict, "cell record")
        if old == new:
            continue
        if _without(old, name) != _without(new, name):
            check_record(cell, out)  # raises: the cell differs in more than that step
            raise ConfigError(f"--redo-after {name}: {path} records other after-steps than the spec; only {name} may differ")
        before = [a for a in old.get("after", []) if a[0] == name]
        todo.append((cell_dir, new, before[0][2] if before else None))
    for cell_dir, new, result in todo:
        if result:
            top = cell_dir / PurePosixPath(result).parts[0]
            shutil.rmtree(top) if top.is_dir() and not top.is_symlink() else top.unlink(missing_ok=True)
        _record(cell_dir, new, again=True)
    return len(todo)


def _without(record: dict[str, Any], name: str) -> dict[str, Any]:
    return {**record, "after": [a for a in record.get("after", []) if a[0] != name]}


def missing(cell: Cell, cell_dir: Path) -> list[Step]:
    return [s for s in cell.steps if not (cell_dir / s.result).exists()]


def _tail(path: Path, lines: int = 6) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_cell(cell_dir: str, steps: list[Step], threads: int = 0, record: Optional[dict] = None,
             divergence: str = "error", job: Optional[slurm.Stoppable] = None) -> dict[str, Any]:
    """Run a cell's missing steps in order, each as `python -m vitlab ...` with its output in
    STEP.log and its wall time in timing.json, first making the cell's folder and its
    cell.json (`record`) where they are absent. A top-level function of plain arguments, so
    submitit can ship it to a job (`job`: a Slurm job's, which starts the steps). `divergence`
    is what a diverging loss does in its steps (vitlab.train.report.DIVERGENCE_ENV): "error"
    stops the step, unless the spec allows it (`allow_divergence: true`, "warn")."""
    folder = Path(cell_dir)
    if record is not None:
        _record(folder, record)
    env = {**os.environ, DIVERGENCE_ENV: divergence}
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    start = time.time()
    for step in steps:
        if (folder / step.result).exists():
            continue
        log = folder / f"{step.name}.log"
        with open(log, "a") as f:
            f.write(f"$ vitlab {' '.join(step.argv)}\n")
            f.flush()
            began, clock = time.time(), time.perf_counter()
            launch = subprocess.Popen if job is None else job.start
            child = launch([sys.executable, "-m", "vitlab", *step.argv], stdout=f, stderr=subprocess.STDOUT, env=env,
                           cwd=os.getcwd())
            try:
                rc = child.wait()
            except BaseException:  # as subprocess.run: the step does not outlive its cell
                child.kill()
                raise
        timing.record(folder, step.name, began, time.perf_counter() - clock, rc, threads)
        if rc != 0 or not (folder / step.result).exists():
            why = f"exit code {rc}" if rc != 0 else f"it wrote no {step.result}"
            if rc == STOPPED:
                why += ": stopped by a signal, with a checkpoint; the same sweep command continues it"
            return {"status": "failed", "step": step.name, "why": why, "log": str(log), "tail": _tail(log)}
    return {"status": "done", "seconds": round(time.time() - start, 1)}


def _report(say: Say, done: int, total: int, cell: Cell, result: dict[str, Any]) -> None:
    if result["status"] == "done":
        say(f"[{done}/{total}] {cell.describe()}: done in {result['seconds']:.0f} s")
    else:
        say(f"[{done}/{total}] {cell.describe()}: FAILED at {result['step']} ({result['why']}); see {result['log']}\n"
            + "\n".join("    " + line for line in result["tail"].splitlines()))


def run_local(todo: Sequence[tuple[Cell, Path, list[Step], Optional[dict[str, Any]]]], jobs: int, threads: int, say: Say,
              divergence: str = "error") -> list[dict]:
    results = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_cell, str(d), steps, threads, record, divergence): cell
                   for cell, d, steps, record in todo}
        for n, future in enumerate(as_completed(futures), 1):
            result = future.result()
            _report(say, n, len(todo), futures[future], result)
            results.append(result)
    return results


def _submitit(launcher: str):
    return require("sweep", f"--launcher {launcher}")["submitit"]


def check_launcher(launcher: str, usable: bool = True) -> None:
    """Refuse, before any cell is made, a launcher vitlab does not know, or (`usable`) one this
    machine cannot use (submitit or Slurm missing)."""
    if launcher not in LAUNCHERS:
        raise ConfigError(f"--launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")
    if not usable:
        return
    if launcher != "local":
        _submitit(launcher)
    if launcher == "slurm" and shutil.which("sbatch") is None:
        raise ConfigError("--launcher slurm: Slurm's sbatch is not on this machine's PATH; run on a login node, or --launcher local")


def submitit_executor(launcher: str, folder: Path, params: dict[str, Any], say: Say = print):
    submitit = _submitit(launcher)
    if launcher == "slurm":
        executor = slurm.executor(submitit, folder, say)
        params = slurm.time_limit(params, say)
    else:
        executor = submitit.LocalExecutor(folder=str(folder))
    try:
        executor.update_parameters(**params)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"--slurm: {e}") from None
    return executor


def run_submitit(todo, launcher: str, folder: Path, params: dict[str, Any], threads: int, wait: bool, say: Say,
                 divergence: str = "error"):
    """Each cell one submitit job; waits for them (and reports each) unless `wait` is False."""
    executor = submitit_executor(launcher, folder, params, say)
    cell = slurm.Stoppable(run_cell) if launcher == "slurm" else run_cell
    jobs = slurm.submit(executor, [(cell, str(d), steps, threads, record, divergence) for _, d, steps, record in todo],
                        f"--launcher {launcher}")
    say(f"submitted {len(jobs)} job(s) through submitit ({launcher}); logs in {folder}")
    if not wait:
        for (cell, *_), job in zip(todo, jobs, strict=True):
            say(f"  job {job.job_id}: {cell.describe()}")
        return None
    cells = {id(job): cell for (cell, *_), job in zip(todo, jobs, strict=True)}
    results = []
    for n, job in enumerate(_submitit(launcher).helpers.as_completed(jobs, poll_frequency=2), 1):
        try:
            result = job.result()
        except Exception as e:  # the job itself died (killed, out of time): the cell resumes next time
            result = slurm.failure(job, e)
        _report(say, n, len(jobs), cells[id(job)], result)
        results.append(result)
    return results


def run(cells: list[Cell], spec: SweepSpec, out: Path, *, jobs: int = 1, threads: int = 0, launcher: str = "local",
        params: Optional[dict[str, Any]] = None, wait: bool = True, say: Say = print) -> Optional[list[dict]]:
    """Run every cell that is not finished; returns the results of those it ran (None when
    jobs were submitted without waiting)."""
    check_launcher(launcher)
    todo = []
    for cell in cells:
        cell_dir = check_record(cell, out)
        steps = missing(cell, cell_dir)
        if steps:
            todo.append((cell, cell_dir, steps, identity(cell)))
    finished = len(cells) - len(todo)
    say(f"sweep {spec.name}: {len(cells)} cell(s), {finished} finished, {len(todo)} to run -> {out}")
    if not todo:
        return []
    divergence = "warn" if spec.allow_divergence else "error"
    if launcher == "local":
        return run_local(todo, jobs, threads, say, divergence)
    return run_submitit(todo, launcher, out / "submitit", params or {}, threads, wait, say, divergence)
