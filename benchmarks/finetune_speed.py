"""`vitlab finetune` beside `vitlab train` on the same model and data, measured in one run.

    python benchmarks/finetune_speed.py               # about 1 CPU-minute; results/finetune-speed.md/.csv
    python benchmarks/finetune_speed.py --first-step  # results/finetune-first-step.md/.csv

--first-step: the time from the command to the first optimiser step (the process started, the
"step 1/N" line read from its output), of `vitlab train --config cifar10 --data digits` and of
a default `vitlab finetune SOURCE --data digits` (the plan, then the first arm of its recipe
sweep), in turns, several rounds; each process is stopped at its first step. Both read the same
model (the source's ViT-C/4) and data at the same batch. The plan reads the checkpoint and the
training split once for every run of the fine-tune (train/inputs.py): its first step should come
within 1.2x of training's.

The model is the CPU CIFAR-10 recipe's ViT-C/4 (6 blocks of width 128, 32 px), on the
digits (upsampled), batch 64. Rounds, interleaved so that a change in the machine's load
hits every system alike:

1. `vitlab train --config cifar10 --data digits` (the recipe's policy: 1 compute thread and
   1 data worker) -- its checkpoint is the source of the fine-tunes;
2. `vitlab finetune THAT --data digits --lr 0.003`: fine-tuning's own policy, which
   takes the source run's threads and workers (the plan line says so);
3. the same with `train.threads=0 data.num_workers=0`: the policy fine-tuning had before
   (one thread per core, data in the training process).

The rate of each is the trainer's own images/s per 5-step window (median, the first
window, start-up, left out). Fine-tuning and training should be within 10%: the same model,
batch, data and threads do the same work per step (SGD and AdamW cost alike next to the
forward and backward passes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import report_tables as tables  # noqa: E402  (this folder's module: the script's folder is on sys.path)
from vitlab.bench import machine

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["round", "measurement", "threads", "data_workers", "steps", "images_per_s", "of_train", "others_cores"]
COMMON = ("--data", "digits", "--batch-size", "64", "--quiet", "train.log_every=5", "train.ckpt_every=1000")


def rate(args: list[str], out: Path) -> tuple[float, float, dict]:
    """Run a vitlab command into `out`: (median windowed images/s, others' cores, the config used)."""
    machine.wait_quiet(0.1, 5.0)
    with machine.CpuMeter() as meter:
        child = subprocess.run([sys.executable, "-m", "vitlab", *args, "--out", str(out)], env=os.environ,
                               capture_output=True, text=True)
        children = os.times()
    if child.returncode != 0:
        raise RuntimeError(f"vitlab {' '.join(args)} failed: {child.stderr.strip().splitlines()[-1:]}")
    own = children.children_user + children.children_system
    others = max(meter.others - own / meter.wall, 0.0)
    run = out / "final" if (out / "final").is_dir() else out
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rates = [r["images_per_s"] for r in lines if r.get("split") == "train"][1:]
    import yaml

    config = yaml.safe_load((run / "config.yaml").read_text())
    return statistics.median(rates), others, config


def first_step(args: list[str], out: Path, timeout: float = 600.0) -> tuple[float, float]:
    """(seconds from starting `vitlab ARGS --out OUT` to its "step 1/" line, others' cores meanwhile);
    the process is stopped there."""
    import shutil
    import time

    shutil.rmtree(out, ignore_errors=True)
    machine.wait_quiet(0.1, 5.0)
    before = os.times()
    with machine.CpuMeter() as meter:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "vitlab", *args, "--out", str(out)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            for line in child.stdout:
                if line.startswith("step 1/"):
                    seconds = time.perf_counter() - start
                    break
                if time.perf_counter() - start > timeout:
                    raise RuntimeError(f"vitlab {' '.join(args)}: no first step in {timeout:.0f} s")
            else:
                raise RuntimeError(f"vitlab {' '.join(args)} ended before its first step")
        finally:
            child.kill()
            child.wait()
    after = os.times()
    own = after.children_user + after.children_system - before.children_user - before.children_system
    return seconds, max(meter.others - own / meter.wall, 0.0)


def first_steps(args: argparse.Namespace, info: dict) -> None:
    """Time to the first optimiser step, `vitlab train` and a default `vitlab finetune`, in turns."""
    source = args.runs / "source"
    if not (source / "checkpoints" / "last.safetensors").is_file():  # a source run: 20 steps of the same recipe
        subprocess.run([sys.executable, "-m", "vitlab", "train", "--config", "cifar10", "--steps", "20", *COMMON,
                        "--out", str(source)], check=True, capture_output=True)
    common = ("--data", "digits", "--batch-size", "64", "--steps", "200", "train.log_every=1")
    systems = [("vitlab train --config cifar10", ["train", "--config", "cifar10", *common]),
               ("vitlab finetune SOURCE (default: the plan, then the recipe sweep's first arm)",
                ["finetune", str(source / "checkpoints" / "last.safetensors"), *common])]
    records, seconds = [], {name: [] for name, _ in systems}
    for r in range(args.rounds):
        for name, cmd in (systems if r % 2 == 0 else systems[::-1]):
            s, others = first_step(cmd, args.runs / "first-step" / name.split()[1])
            seconds[name].append(s)
            records.append({"round": r, "measurement": name, "seconds_to_first_step": f"{s:.2f}",
                            "others_cores": f"{others:.2f}"})
            print(records[-1], flush=True)
    train, ft = (seconds[name] for name, _ in systems)
    ratios = sorted(f / t for f, t in zip(ft, train, strict=True))
    notes = (f"Median time to the first step: vitlab train {statistics.median(train):.2f} s, vitlab finetune "
             f"{statistics.median(ft):.2f} s; fine-tune over train, paired by round: median "
             f"{statistics.median(ratios):.2f} (rounds {ratios[0]:.2f}-{ratios[-1]:.2f}); the goal is at most 1.2.\n\n"
             "From starting the process (Python, imports) to the \"step 1/N\" line of its output: the CPU "
             "CIFAR-10 recipe's ViT-C/4 on the digits, batch 64, one compute thread per process "
             "(OMP_NUM_THREADS=1), the two commands in turns (their order alternating by round). The fine-tune is a "
             "default one: its plan (the checkpoint and the training split read once, train/inputs.py), then the "
             "first arm of the recipe sweep. others_cores: other processes' CPU use meanwhile, the run's own data-loader "
             "worker included (a process the run starts; the machine is also shared with other jobs).\n")
    tables.write_table(args.out, "finetune-first-step", "Time to the first optimiser step: vitlab finetune beside "
                       "vitlab train", info, records, ["round", "measurement", "seconds_to_first_step", "others_cores"],
                       notes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--runs", type=Path, default=Path("runs/finetune-speed"))
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--first-step", action="store_true", help="time to the first optimiser step instead")
    args = p.parse_args()
    info = machine.machine_info()
    if args.first_step:
        first_steps(args, info)
        return
    steps = ("--steps", str(args.steps))
    records = []
    for r in range(args.rounds):
        base = args.runs / f"round{r}"
        systems = [
            ("vitlab train --config cifar10", ["train", "--config", "cifar10", *steps, *COMMON], base / "train"),
            ("vitlab finetune (its policy)", ["finetune", str(base / "train" / "checkpoints" /
                                              "last.safetensors"), "--lr", "0.003", *steps, *COMMON], base / "ft"),
            ("vitlab finetune, threads 0, workers 0 (before)", ["finetune", str(base / "train" / "checkpoints"
                                                                / "last.safetensors"), "--lr", "0.003", *steps,
                                                                *COMMON, "train.threads=0", "data.num_workers=0"],
             base / "ft-old"),
        ]
        train_rate = None
        for name, cmd, out in systems:
            img_s, others, cfg = rate(cmd, out)
            train_rate = train_rate or img_s
            records.append({"round": r, "measurement": name, "threads": cfg["train"].get("threads", 0),
                            "data_workers": cfg["data"].get("num_workers", 0), "steps": args.steps,
                            "images_per_s": f"{img_s:.1f}", "of_train": f"{img_s / train_rate:.0%}",
                            "others_cores": f"{others:.2f}"})
            print(records[-1], flush=True)

    def median_of_train(name: str) -> str:
        ratios = [float(r["images_per_s"]) / float(t["images_per_s"]) for r in records for t in records
                  if r["measurement"] == name and t["round"] == r["round"] and t["measurement"].startswith("vitlab train")]
        return f"{statistics.median(ratios):.0%} (rounds {min(ratios):.0%}-{max(ratios):.0%})"

    medians = (f"Median over the rounds of fine-tuning's rate over training's: its policy "
               f"{median_of_train('vitlab finetune (its policy)')}, the policy before "
               f"{median_of_train('vitlab finetune, threads 0, workers 0 (before)')}.\n\n")
    notes = medians + ("The CPU CIFAR-10 recipe's ViT-C/4 (811k parameters, 32 px) on the digits, batch 64, "
             f"{args.steps} steps per run, {args.rounds} round(s), the systems in turn. images_per_s: the trainer's own "
             "rate per 5-step window (median, start-up window left out). of_train: over the same round's "
             "`vitlab train`. threads 0 = one per core. others_cores: other processes' CPU use meanwhile "
             "(the machine is shared with other jobs).\n")
    tables.write_table(args.out, "finetune-speed", "vitlab finetune beside vitlab train, same model and data", info,
                       records, COLUMNS, notes)


if __name__ == "__main__":
    main()
