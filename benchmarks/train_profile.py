"""Where a training step's time goes, by kind of work (issue 51): the AdamW step `vitlab bench
--task train` times, under op_profile.py's operator timer (one thread, CPU time per operator).

    python benchmarks/train_profile.py --model ViT-S/16 --batch-size 32 bf16-autocast fp32
    python benchmarks/train_profile.py --model ViT-B/16 --image-size 384 --batch-size 8 fp32 bf16-autocast

Prints, per precision, the seconds per step, each kind's share and the heaviest operators.
"""

from __future__ import annotations

import argparse

import torch

from op_profile import profile
from vitlab.api import get_config
from vitlab.bench.systems import Setting, System, prepare


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("precision", nargs="+", choices=("fp32", "bf16-autocast"))
    p.add_argument("--model", default="ViT-S/16")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, help="square images of this size (fine-tuning at 384: 384)")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = get_config(args.model)
    if args.image_size:
        cfg = cfg.replace(image_size=(args.image_size, args.image_size))
    for precision in args.precision:
        step = prepare(Setting(cfg, args.batch_size, "train"), System("vitlab", precision), warmup=1)
        prof = profile(step.fn, calls=1, warmup=0)
        print(precision, f"{prof.seconds:.2f} s/step")
        for kind, s in prof.by_kind.items():
            print(f"  {kind:40s} {s * 1e3:8.0f} ms {s / prof.timed:5.0%}")
        for op, s in sorted(prof.by_op.items(), key=lambda kv: -kv[1])[:22]:
            print(f"    {op:45s} {s * 1e3:8.0f} ms  x{prof.calls[op]}")


if __name__ == "__main__":
    main()
