"""The two synthetic tasks with known answers (vitlab/data/synthetic.py), run in full.

    python benchmarks/synthetic.py                     # writes benchmarks/results/synthetic.{json,md}
    python benchmarks/synthetic.py --seeds 2 --steps 150 --out /tmp/syn   # a pilot

halfswap: ViT with a learned position embedding, ViT with none, and a small BiT ResNet, on
all 10,000 training images. The ViT without a position embedding must sit at chance.
crossover: the same three on 500, 2,000 and 10,000 training images (a pilot of the
crossover the paper finds between ResNets and ViTs as the data grows, §4.2). Every model
trains the same steps; per arm the mean, std and 95% t interval over seeds, and paired
differences (vitlab.sweep.stats) of ViT-learned against the ResNet and against ViT-none.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vitlab.config import load_recipe
from vitlab.sweep import stats
from vitlab.train.inputs import Inputs
from vitlab.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "ViT-learned": {"model.pos_embed": "learned"},
    "ViT-none": {"model.pos_embed": "none"},
    "ResNet": {"model.name": "BiT-R26-C", "model.layers": [1, 1, 1, 1], "model.base_width": 8, "model.gn_groups": 4},
}
SIZES = {"halfswap": [0], "crossover": [0, 2000, 500]}  # 0 = all 10,000; the full set first


def one(task: str, model: str, size: int, seed: int, steps: int, out: Path) -> dict:
    base = load_recipe(ROOT / "src" / "vitlab" / "configs" / "synthetic.yaml")
    if model == "ResNet":  # a BiT section: the ViT keys of the recipe do not apply
        d = base.to_dict()
        d["model"] = {"name": "BiT-R26-C", "image_size": 16, "layers": [1, 1, 1, 1], "base_width": 8,
                      "gn_groups": 4, "head_init": "xavier"}
        base = type(base).from_dict(d)
        over = {}
    else:
        over = dict(MODELS[model])
    cfg = base.with_overrides({**over, "data.name": f"synthetic:{task}", "data.train_size": size,
                               "train.steps": steps, "train.seed": seed, "train.ckpt_every": steps})
    folder = out / "runs" / f"{task}_{model}_n{size or 10000}_s{seed}"
    summary = Trainer(cfg, folder, Inputs(), quiet=True).run()
    return {"task": task, "model": model, "train_images": size or 10000, "seed": seed,
            "top1": summary["splits"]["test"]["top1"], "train_seconds": summary["train_seconds"]}


def analyse(cells: list[dict]) -> dict:
    arms, pairs = [], []
    keys = sorted({(c["task"], c["train_images"]) for c in cells})
    for task, n in keys:
        here = [c for c in cells if c["task"] == task and c["train_images"] == n]
        by = {m: {c["seed"]: c["top1"] for c in here if c["model"] == m} for m in MODELS}
        for m, vals in by.items():
            if vals:
                arms.append({"task": task, "train_images": n, "model": m, **stats.describe(list(vals.values()), bounds=(0.0, 1.0))})
        for a, b in (("ViT-learned", "ViT-none"), ("ViT-learned", "ResNet")):
            if by[a] and by[b]:
                d = stats.paired(by[a], by[b])
                pairs.append({"task": task, "train_images": n, "a": a, "b": b, **d})
    return {"arms": arms, "pairs": pairs}


def markdown(result: dict) -> str:
    lines = ["# Synthetic tasks with known answers", "", result["note"], "",
             "| task | train images | model | n | test top-1 % mean | std | 95% t interval |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for a in result["arms"]:
        ci = f"[{a['lo'] * 100:.1f}, {a['hi'] * 100:.1f}]" if a["lo"] is not None else "-"
        std = f"{a['std'] * 100:.1f}" if a["std"] is not None else "-"
        lines.append(f"| {a['task']} | {a['train_images']:,} | {a['model']} | {a['n']} | {a['mean'] * 100:.1f} | {std} | {ci} |")
    lines += ["", "| task | train images | a - b | n | mean diff (points) | 95% interval | p (paired t) |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for p in result["pairs"]:
        ci = f"[{p['lo'] * 100:+.1f}, {p['hi'] * 100:+.1f}]" if p["lo"] is not None else "-"
        pv = "-" if p["p"] is None else (f"{p['p']:.3f}" if p["p"] >= 0.001 else "<0.001")
        lines.append(f"| {p['task']} | {p['train_images']:,} | {p['a']} - {p['b']} | {p['n']} | "
                     f"{p['mean'] * 100:+.1f} | {ci} | {pv} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--tasks", default="halfswap,crossover")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--runs", type=Path, help="where the run folders go (default OUT/../synthetic-runs, not committed)")
    p.add_argument("--report", action="store_true", help="only redo the statistics and synthetic.md from the "
                   "cells in OUT/synthetic.json (no runs)")
    args = p.parse_args(argv)
    if args.report:
        result = json.loads((args.out / "synthetic.json").read_text())
        result.update(analyse(result["cells"]))
        note = result["note"].replace("Intervals: 95% Student t over seeds;", "Intervals: 95% Student t over seeds "
                                      "(an arm's clipped to 0-100%);")
        result["note"] = note
        (args.out / "synthetic.json").write_text(json.dumps(result, indent=2))
        (args.out / "synthetic.md").write_text(markdown(result))
        return 0
    runs = args.runs or Path("/tmp") / "vitlab-synthetic-runs"
    start, cells = time.time(), []
    plan = [(task, size, model, seed) for task in args.tasks.split(",") for size in SIZES[task]
            for model in MODELS for seed in range(args.seeds)]
    for task, size, model, seed in plan:  # the results are rewritten after each cell: a stopped run keeps them
        cells.append(one(task, model, size, seed, args.steps, runs))
        print(json.dumps(cells[-1]), flush=True)
        write(args, cells, len(plan), time.time() - start)
    print(f"wrote {args.out / 'synthetic.json'} and synthetic.md in {time.time() - start:.0f} s")
    return 0


def write(args, cells: list[dict], planned: int, seconds: float) -> None:
    result = {"steps": args.steps, "batch_size": 64, "seeds": args.seeds, "cells": cells, **analyse(cells),
              "wall_s": round(seconds, 1), "planned_cells": planned,
              "note": (f"{len(cells)} of {planned} cells finished; {args.steps} steps of 64 for every cell, "
                       f"{args.seeds} seeds, one CPU thread per run, on 2 CPU cores that other jobs shared "
                       f"({seconds / 60:.0f} minutes of wall time). Intervals: 95% Student t over seeds (an arm's "
                       "clipped to 0-100%); "
                       "differences paired by seed.")}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "synthetic.json").write_text(json.dumps(result, indent=2))
    (args.out / "synthetic.md").write_text(markdown(result))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
