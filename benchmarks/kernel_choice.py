"""Issue 51: is the default CPU inference path (the kernels `vitlab.deploy.kernels` timed on this
machine) at least as fast as the plain model and the fastest peer? One interleaved run.

    python benchmarks/kernel_choice.py --name kernel-choice-zen4     # about 5 minutes on a busy 2-core machine

It runs `vitlab bench --clock cpu` (one thread timed by its own CPU time: other processes cannot
distort it) for ViT-Ti/16 and ViT-B/16 at batch 1 and 8 with vitlab's `fp32` (the plain model,
PyTorch's F.linear), `fp32-packed` (every Dense layer on oneDNN: the default before issue 51,
the old row of the pair) and `fp32-auto` (the default now), beside timm, Hugging Face and
torchvision in fp32 and the matrix-product ceilings of each kernel library, all in the same
rounds. The table's foot lists the kernel chosen for each shape and the timings it was chosen by.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True, help="result file name in benchmarks/results (say the CPU kind)")
    p.add_argument("--rounds", default="3")
    args = p.parse_args()
    cmd = [sys.executable, "-m", "vitlab", "bench", "--model", "ViT-Ti/16", "ViT-B/16", "--batch-size", "1", "8",
           "--precision", "fp32", "fp32-packed", "fp32-auto", "--peers", "timm", "hf", "torchvision",
           "--clock", "cpu", "--rounds", args.rounds, "--out", str(ROOT / "benchmarks" / "results"), "--name", args.name]
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
