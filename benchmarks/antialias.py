"""Does antialiased resizing change accuracy? data.antialias on and off, paired by seed.

    python benchmarks/antialias.py                  # 3 seeds, 300 steps each (about 35 min on 2 busy cores)
    python benchmarks/antialias.py --seeds 5 --steps 390

CIFAR-10's real photos (../shared/data/cifar10, 32x32) are shrunk to SIZE (default 20: a
factor of 1.6, where a resize without a filter drops pixels) for training and for the test
set, by the same transform in both: the whole image (data.crop=whole, VTAB's geometry), the
flip, no crop, so every image is downsampled. Each seed trains one small ViT per setting
from the same initialisation and data order (`vitlab train --antialias` / `--no-antialias`)
and evaluates it on the 10,000 test images. The paired difference of top-1 (on - off) over
seeds gets a Student-t interval (vitlab.sweep.stats.paired). Writes
benchmarks/results/antialias-cifar10.csv and .md; the runs stay under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from vitlab.sweep import stats

ROOT = Path(__file__).resolve().parent
SHARDS = ROOT.parent.parent / "shared" / "data" / "cifar10"
MODEL = ["model.hidden_size=64", "model.depth=4", "model.num_heads=2", "model.mlp_dim=128"]


def run(setting: bool, seed: int, args) -> dict:
    out = Path(args.out) / f"{'on' if setting else 'off'}-seed{seed}"
    summary = out / "summary.json"
    if not summary.exists():
        cmd = ["vitlab", "train", "--config", "cifar10", "--data", f"wds:{SHARDS}", "--image-size", str(args.size),
               "--steps", str(args.steps), "--warmup-steps", "30", "--eval-every", "0", "--seed", str(seed),
               "--antialias" if setting else "--no-antialias", "--out", str(out), "--quiet",
               *MODEL, "data.crop=whole", "train.ckpt_every=100000"]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    s = json.loads(summary.read_text())
    test = s["splits"]["test"]
    return {"antialias": setting, "seed": seed, "top1": test["top1"], "loss": test["loss"],
            "train_seconds": s.get("train_seconds")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--size", type=int, default=20)
    p.add_argument("--out", default="runs/antialias")
    args = p.parse_args()
    rows = [run(setting, seed, args) for seed in range(args.seeds) for setting in (True, False)]
    on = {r["seed"]: 100 * r["top1"] for r in rows if r["antialias"]}
    off = {r["seed"]: 100 * r["top1"] for r in rows if not r["antialias"]}
    d = stats.paired(on, off)
    results = ROOT / "results"
    with open(results / "antialias-cifar10.csv", "w") as f:
        f.write("antialias,seed,test_top1,test_loss,train_seconds\n")
        for r in rows:
            f.write(f"{r['antialias']},{r['seed']},{r['top1']:.4f},{r['loss']:.4f},{r['train_seconds']}\n")
    lo, hi = d["lo"], d["hi"]
    shown = "not shown (the interval contains 0)" if lo <= 0 <= hi else ("antialiasing helps" if lo > 0 else "antialiasing hurts")
    lines = [
        "# data.antialias: accuracy with and without a filter before shrinking",
        "",
        f"`python benchmarks/antialias.py --seeds {args.seeds} --steps {args.steps} --size {args.size}` "
        f"(CIFAR-10 shrunk 32 -> {args.size} for training and test, whole image + flip, a width-64 depth-4 "
        f"ViT-C/4, {args.steps} steps of 128; test: the 10,000 test images).",
        "",
        "| seed | top-1, antialias on (%) | top-1, off (%) | on - off (points) |",
        "| --- | --- | --- | --- |",
        *(f"| {s} | {on[s]:.2f} | {off[s]:.2f} | {on[s] - off[s]:+.2f} |" for s in sorted(on)),
        "",
        f"Paired difference on - off: {d['mean']:+.2f} points, 95% t interval [{lo:+.2f}, {hi:+.2f}] over "
        f"{d['n']} seeds (p = {d['p']:.3g}): {shown}.",
        "",
    ]
    (results / "antialias-cifar10.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
