"""Run every cell of a sweep spec, a YAML file (its format, every field with an example:
`python -m pydoc vitlab.config.sweep`; the shipped configs/paper/*.yaml are real ones):
each cell is `vitlab train` into OUT/CELL/train plus the spec's after-steps (few-shot,
fine-tuning, inspect, ...). Finished cells are skipped; an interrupted cell resumes from
its newest checkpoint, so stopping and rerunning the same command is always safe. Then
OUT/results.csv holds one row per cell, OUT/report.md and OUT/report.json the statistics
(per arm: mean, std and 95% t interval over seeds; per pair the spec's `report.compare`
names: the paired-by-seed difference, its 95% interval, the paired-t p-value and the
verdict by the rule printed in report.md), and the figures the spec asks for are in OUT.

--jobs N runs N cells side by side on this machine (each with --threads CPU threads, by
default the cores divided by N). --launcher slurm submits each cell as a Slurm job through
submitit (--slurm KEY=VALUE sets submitit's executor parameters: timeout_min=120,
slurm_partition=gpu, gpus_per_node=1, cpus_per_task=8, ...); --launcher submitit-local
runs the same jobs through submitit's local executor. --scale S multiplies the keys the
spec lists under `scale` (epochs, training-set size, ...), for a bigger machine.

examples:
  vitlab sweep paper/pos-embed --out runs/sweeps/pos-embed
  vitlab sweep my-sweep.yaml --jobs 2
  vitlab sweep paper/data-size --scale 10 --launcher slurm --slurm timeout_min=240 --slurm gpus_per_node=1
  vitlab sweep paper/data-size --report          # tabulate and plot what has finished
  vitlab sweep --report runs/sweeps/pos-embed     # the same, from the folder alone
"""

from __future__ import annotations

import argparse
import os

from vitlab.cli.common import COUNT, COUNT_OR_ZERO, flag_number

RESUMABLE = True  # stopped, the same command continues from the last checkpoint
READS_DATA = True  # data specs from files may name a pipe: command (--allow-pipe)
HELP = "run a grid of trainings (models x data sizes x seeds x any key=value), then tabulate and plot"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="?", help="a sweep spec YAML file, or a shipped one's name (paper/pos-embed, ...)")
    p.add_argument("--out", metavar="DIR", help="the sweep folder (default: runs/sweeps/NAME, -xS for --scale S)")
    p.add_argument("--scale", type=flag_number(above=0), default=1.0, help="multiply the spec's `scale` keys by this (default 1)")
    p.add_argument("--jobs", type=COUNT, default=1, help="cells run side by side by the local launcher (default 1)")
    p.add_argument("--threads", type=COUNT_OR_ZERO, help="CPU threads per cell (default: the cores divided by --jobs)")
    p.add_argument("--launcher", default="local", help="local (default), slurm, or submitit-local")
    p.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                   help="a submitit executor parameter, e.g. timeout_min=60 or slurm_partition=gpu")
    p.add_argument("--no-wait", action="store_true", help="submit the jobs and return (then collect with --report)")
    p.add_argument("--report", nargs="?", const=True, metavar="DIR",
                   help="run nothing: write results.csv, report.md/.json (the statistics) and the figures so far; "
                        "`--report DIR` alone rebuilds them from a sweep folder's cells and its sweep.json")
    p.add_argument("--redo-after", metavar="STEP", default="",
                   help="run the after-step STEP again in every finished cell, with the spec's command now (e.g. a "
                        "control drawn K times); the cells may differ from the spec in that step only, and the claims "
                        "that read it are recorded as post hoc in sweep.json")
    p.add_argument("--dry-run", action="store_true", help="print the number of cells and each cell's commands; run nothing")
    p.add_argument("--max-cells", type=COUNT, default=None, metavar="N",
                   help="run a grid of up to N cells (default 10000: a bigger grid is refused as a likely mistake)")


def _check(args: argparse.Namespace) -> int:
    """The flags' own checks; returns --max-cells (its default where not given)."""
    from vitlab.cli import UsageError
    from vitlab.sweep.cells import MAX_CELLS

    if args.redo_after and (args.report or args.dry_run):
        raise UsageError(f"--redo-after {args.redo_after} runs a step; --report and --dry-run run nothing: give one")
    return MAX_CELLS if args.max_cells is None else args.max_cells


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vitlab.cli import UsageError
    from vitlab.cli.common import launcher_params
    from vitlab.config.sweep import load_sweep
    from vitlab.sweep import dry_run, run_sweep
    from vitlab.sweep.runner import check_launcher

    max_cells = _check(args)
    if isinstance(args.report, str):  # --report DIR: the folder says what it is
        if args.out and Path(args.out) != Path(args.report):
            raise UsageError(f"--report {args.report} and --out {args.out} name two folders; give one")
        args.out = args.report
        if args.spec is None:
            from vitlab.sweep import load_folder
            spec, args.scale = load_folder(Path(args.report))
            run_sweep(spec, Path(args.report), scale=args.scale, report_only=True, max_cells=max_cells)
            return 0
    if args.spec is None:
        raise UsageError("name a sweep spec (a YAML file or a shipped name such as paper/pos-embed), "
                         "or rebuild a finished sweep's report with --report DIR")
    spec, source = load_sweep(args.spec)
    check_launcher(args.launcher, usable=not (args.dry_run or args.report))  # said now, before any cell
    suffix = "" if args.scale == 1 else f"-x{args.scale:g}"
    out = Path(args.out or f"runs/sweeps/{spec.name}{suffix}")
    if args.dry_run:
        print("\n".join(dry_run(spec, out, args.scale, max_cells)))
        return 0
    # A Slurm job runs on its own allocation: its threads are the job's, not this machine's.
    local = args.launcher != "slurm"
    threads = args.threads or (max(1, (os.cpu_count() or 1) // args.jobs) if local else 0)
    summary = run_sweep(spec, out, scale=args.scale, jobs=args.jobs, threads=threads, launcher=args.launcher,
                        params=launcher_params(args.slurm), wait=not args.no_wait, report_only=bool(args.report),
                        max_cells=max_cells, source=source, redo=args.redo_after)
    if summary.get("submitted"):
        print(f"then: vitlab sweep {args.spec} --out {out} --report")
        return 0
    return 1 if summary["failed"] else 0
