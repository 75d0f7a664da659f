"""`vitlab train` end to end beside its bare training step, measured in the same session.

The bare step is `vitlab.bench.systems.training_call`: forward, cross-entropy, backward and an
AdamW step on one batch held in memory, at the recipe's model, batch, precision and thread
count. End to end is the `vitlab train` command on the real CIFAR-10 shards: decoding and
augmenting (in the recipe's data workers), the trainer's own step (label smoothing, gradient
clipping, the schedule), logging and checkpoints. Its rate is the trainer's own
`images_per_s` of each 10-step window, the first window (start-up) left out. The bare step
is measured before and after the run, so a change in the machine's load shows.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import report_tables as tables  # noqa: E402  (this folder's module: the script's folder is on sys.path)
from vitlab.bench import machine
from vitlab.bench.systems import System, build_model, training_call
from vitlab.checkpoints.peers import variant_config
from vitlab.config import load_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "benchmarks" / "train-c4-bf16.yaml"
COLUMNS = ["measurement", "threads", "data_workers", "steps", "images_per_s", "of_bare_step", "others_cores"]


def bare_rate(recipe, threads: int, seconds: float = 20.0) -> tuple[float, float]:
    """Images/s of the bare step, and the other processes' CPU use (cores) meanwhile."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cfg, batch = variant_config(recipe.model.name, **recipe.model.changes), recipe.train.batch_size
        torch.manual_seed(0)
        x = torch.randn(batch, cfg.in_channels, *cfg.image_size)
        y = torch.randint(0, cfg.num_classes, (batch,))
        precision = "bf16-autocast" if recipe.train.precision == "bf16" else "fp32"
        step = training_call(build_model("vitlab", cfg, precision), System("vitlab", precision), x, y)
        step()
        step()
        machine.wait_quiet(0.1, 5.0)
        with machine.CpuMeter() as meter:
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                step()
                n += 1
        return n * batch / meter.wall, meter.others
    finally:
        torch.set_num_threads(previous)


def train_rate(out: Path, data: str, threads: int, workers: int, steps: int,
               overrides: tuple[str, ...] = ()) -> tuple[float, float, int]:
    """Run `vitlab train` on the recipe; (median windowed images/s, others' cores, steps)."""
    args = [sys.executable, "-m", "vitlab", "train", "--config", str(RECIPE), "--data", data, "--out", str(out),
            "--quiet", f"train.threads={threads}", f"data.num_workers={workers}", *overrides]
    if steps:
        args.append(f"--steps={steps}")
    machine.wait_quiet(0.1, 5.0)
    with machine.CpuMeter() as meter:
        child = subprocess.run(args, env=os.environ, capture_output=True, text=True)
        children = os.times()
    if child.returncode != 0:
        raise RuntimeError(f"vitlab train failed: {child.stderr.strip().splitlines()[-1:]}")
    # The child's CPU counts as "others" in the meter; take it back out.
    own_child = children.children_user + children.children_system
    others = max(meter.others - own_child / meter.wall, 0.0)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["images_per_s"] for r in lines if r.get("split") == "train"][1:]
    return statistics.median(rates), others, lines[-1].get("step", 0) if lines else 0


def end_to_end(out_dir: Path, info: dict, data: str, runs_dir: Path, log, configs=((1, 1, 0), (2, 1, 150), (2, 0, 150)),
               name: str = "end-to-end") -> None:
    """For each (threads, data workers, steps; 0 = the recipe's epoch; then any overrides such as
    data.decode=pil): bare, end to end, bare."""
    recipe = load_recipe(str(RECIPE))
    records = []
    for threads, workers, steps, *overrides in configs:
        before, busy_before = bare_rate(recipe, threads)
        tag = "".join("-" + o.split("=")[-1] for o in overrides)
        run = runs_dir / f"c4-bf16-t{threads}w{workers}{tag}"
        e2e, busy, done = train_rate(run, data, threads, workers, steps, tuple(overrides))
        after, busy_after = bare_rate(recipe, threads)
        bare = (before + after) / 2
        log(f"end to end, {threads} threads, {workers} workers: {e2e:.1f} img/s; bare step {before:.1f} / {after:.1f}")
        records += [
            {"measurement": "bare step, before", "threads": threads, "images_per_s": f"{before:.1f}",
             "others_cores": f"{busy_before:.2f}"},
            {"measurement": f"vitlab train ({run.name})", "threads": threads, "data_workers": workers,
             "steps": done, "images_per_s": f"{e2e:.1f}", "of_bare_step": f"{e2e / bare:.0%}",
             "others_cores": f"{busy:.2f}"},
            {"measurement": "bare step, after", "threads": threads, "images_per_s": f"{after:.1f}",
             "others_cores": f"{busy_after:.2f}"},
        ]
    notes = (f"Recipe: `{RECIPE.relative_to(ROOT)}` (ViT-C/4, batch 128, bf16 autocast) on the real CIFAR-10 "
             "shards. End to end: the trainer's own images/s per 10-step window (median, start-up window "
             "left out), data decoding and augmentation included (in data_workers worker processes; 0: in "
             "the training process itself, between steps). Bare step: the "
             "same model, batch, precision and threads on one batch in memory (forward, cross-entropy, "
             "backward, AdamW), 20 s each, before and after the run. of_bare_step is end to end over the "
             "mean of the two. others_cores: other processes' CPU use during the measurement (the "
             "machine is shared).\n")
    tables.write_table(out_dir, name, "vitlab train end to end beside the bare step", info,
                       records, COLUMNS, notes)
