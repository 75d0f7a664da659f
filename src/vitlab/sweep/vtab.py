"""VTAB-1k with one job per task: each task is `vitlab vtab CKPT --tasks TASK ...` into the
same OUT, run side by side here (--jobs) or as submitit jobs on Slurm (or submitit's local
executor), through the sweep's own launchers (runner.py). Each job writes OUT/TASK/result.json;
the row is then made from all of them (train/vtab.py), so the jobs may finish in any order,
and a rerun submits only the tasks without a result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from vitlab.data.vtab import Task
from vitlab.sweep.cells import Cell, Step
from vitlab.sweep.runner import Say, run_local, run_submitit
from vitlab.train.inputs import Inputs
from vitlab.train.vtab import Settings, absent, check_suite


def child_argv(checkpoint: str, root: Path, out: Path, s: Settings, task: Task, force: bool = False) -> tuple[str, ...]:
    """The `vitlab vtab` command line of one task's job, with the suite's settings (and
    --force, the suite's own leave to replace edited tables)."""
    argv = ["vtab", checkpoint, "--root", str(root), "--out", str(out), "--tasks", task.name, "--steps", str(s.steps),
            "--batch-size", str(s.batch_size), "--seed", str(s.seed), "--device", s.device, "--quiet"]
    if force:
        argv.append("--force")
    if s.lr is not None:
        argv += ["--lr", repr(s.lr)]
    if s.grid:  # (the two are never both set: Settings refuses that)
        argv += ["--lr-grid", ",".join(repr(r) for r in s.grid)]
    argv += ["--image-size", str(s.image_size or "checkpoint")]
    argv += [f"--tfds-version={a}" for a in s.accept]
    return (*argv, *s.overrides)


def launch(checkpoint: str, root: Path, out: Path, tasks: Sequence[Task], s: Settings, inputs: Inputs, *,
           launcher: str = "local", jobs: int = 1, threads: int = 0, params: Optional[dict[str, Any]] = None, wait: bool = True,
           say: Say = print, force: bool = False) -> Optional[list[dict]]:
    """Run each task without a result as its own job (a task without data is said, not
    submitted; a result of other work is refused first, train/vtab.check_suite, on the command's
    plan `inputs`, which then makes the row); None when submitted without waiting."""
    check_suite(checkpoint, root, out, tasks, s, inputs, force)  # a user's tables, a result of other work: refused first
    todo, missing = [], absent(root, tasks)
    for task in tasks:
        folder = out / task.name
        if task.name in missing:
            say(f"vtab {missing[task.name]}")
            continue
        if (folder / "result.json").is_file():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        step = Step("vtab", child_argv(checkpoint, root, out, s, task, force), "result.json")
        todo.append((Cell(task.name, {"task": task.name}, {}, (step,)), folder, [step], None))  # no cell.json
    say(f"vtab: {len(tasks)} task(s), {len(missing)} without data, {len(tasks) - len(missing) - len(todo)} finished, "
        f"{len(todo)} to run as jobs -> {out}")
    if not todo:
        return []
    if launcher == "local":
        return run_local(todo, jobs, threads, say, divergence="warn")  # a task's divergence is its result's to show
    return run_submitit(todo, launcher, out / "submitit", params or {}, threads, wait, say, divergence="warn")
