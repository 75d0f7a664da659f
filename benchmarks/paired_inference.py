"""Does inference, or a training step, regress against an earlier commit? Both in one interleaved run.

    git worktree add /tmp/old COMMIT
    python benchmarks/paired_inference.py --old /tmp/old            # about 7 minutes on 2 cores
    python benchmarks/paired_inference.py --old /tmp/old --task train --clock cpu --label e49fe3d
    python benchmarks/paired_inference.py --tables                  # the tables from the kept CSVs

Each pair is `vitlab bench --model ViT-B/16 --batch-size 1 8 --precision fp32 bf16 --peers timm
--rounds 1` (with --task train: `--model ViT-C/4 --batch-size 128 --task train --precision fp32
bf16-autocast`) run with this checkout's code, then with the old checkout's (PYTHONPATH), so that
a change of the machine's speed between pairs hits both alike; the pairs' ratios (this / old, and
each against timm in its own run) are the comparison. The bench CSVs are kept in
benchmarks/results/paired-inference/ (a training run's named train-*) and summarised in
benchmarks/results/paired-inference.md or paired-training.md.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEPT = ROOT / "benchmarks" / "results" / "paired-inference"
# task -> (the bench arguments, the (batch, precision) rows compared, the kept files' prefix, the table's file)
TASKS = {
    "infer": (["--model", "ViT-B/16", "--batch-size", "1", "8", "--precision", "fp32", "bf16"],
              [(b, p) for b in ("1", "8") for p in ("fp32", "bf16")], "", "paired-inference.md"),
    "train": (["--model", "ViT-C/4", "--batch-size", "128", "--task", "train", "--precision", "fp32", "bf16-autocast"],
              [("128", p) for p in ("fp32", "bf16-autocast")], "train-", "paired-training.md"),
}


def bench(src: Path, name: str, task: str, clock: str) -> None:
    cmd = [sys.executable, "-m", "vitlab", "bench", *TASKS[task][0], "--peers", "timm", "--rounds", "1",
           "--clock", clock, "--out", str(KEPT), "--name", name]
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    subprocess.run(cmd, cwd=src, env=env, check=True, capture_output=True)


def rows(name: str) -> dict:
    with open(KEPT / f"{name}.csv") as f:
        return {(r["batch"], r["impl"], r["precision"]): r for r in csv.DictReader(f)}


def table(pairs: int, old: str, task: str = "infer", clock: str = "wall") -> str:
    args, settings, prefix, _ = TASKS[task]
    model = args[1]
    out = [f"# {'Inference' if task == 'infer' else 'A training step'}, this code against {old}, interleaved pairs\n",
           f"`python benchmarks/paired_inference.py --old OLD_CHECKOUT --task {task}`: {pairs} pairs of `vitlab bench "
           f"{' '.join(args)} --peers timm --rounds 1 --clock {clock}`, this code first in each pair. "
           "The bench files of each run are in `paired-inference/` (their headers say the machine and its load).\n",
           f"| {model} | precision | this, img/s | old, img/s | this ÷ old, per pair (median) | this, % of ceiling "
           "| old, % of ceiling | this × timm | old × timm |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for batch, prec in settings:
        new = [rows(f"{prefix}head-{i}")[(batch, "vitlab", prec)] for i in range(1, pairs + 1)]
        was = [rows(f"{prefix}old-{i}")[(batch, "vitlab", prec)] for i in range(1, pairs + 1)]
        timm_new = [rows(f"{prefix}head-{i}")[(batch, "timm", prec)] for i in range(1, pairs + 1)]
        timm_old = [rows(f"{prefix}old-{i}")[(batch, "timm", prec)] for i in range(1, pairs + 1)]
        ratio = [float(a["images_per_s"]) / float(b["images_per_s"]) for a, b in zip(new, was, strict=True)]
        vs = lambda xs, ts: " / ".join(f"{float(x['images_per_s']) / float(t['images_per_s']):.2f}"  # noqa: E731
                                       for x, t in zip(xs, ts, strict=True))
        col = lambda xs, k: " / ".join(x[k] for x in xs)  # noqa: E731
        out.append(f"| b{batch} | {prec} | {col(new, 'images_per_s')} | {col(was, 'images_per_s')} | "
                   f"{' / '.join(f'{r:.2f}' for r in ratio)} ({statistics.median(ratio):.2f}) | "
                   f"{col(new, 'pct_of_ceiling')} | {col(was, 'pct_of_ceiling')} | {vs(new, timm_new)} | "
                   f"{vs(was, timm_old)} |")
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", type=Path, help="a checkout of the earlier commit (git worktree add)")
    p.add_argument("--label", default="e182ed4", help="what --old is, for the table's title")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--task", choices=sorted(TASKS), default="infer", help="inference (ViT-B/16) or a training step (ViT-C/4)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="vitlab bench's clock (cpu on a busy machine)")
    p.add_argument("--tables", action="store_true", help="only write the table from the kept CSVs")
    args = p.parse_args()
    prefix, page = TASKS[args.task][2:]
    if not args.tables:
        if args.old is None:
            p.error("give --old CHECKOUT (or --tables)")
        KEPT.mkdir(parents=True, exist_ok=True)
        for i in range(1, args.pairs + 1):
            bench(ROOT, f"{prefix}head-{i}", args.task, args.clock)
            bench(args.old.resolve(), f"{prefix}old-{i}", args.task, args.clock)
    text = table(args.pairs, args.label, args.task, args.clock)
    (ROOT / "benchmarks" / "results" / page).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
