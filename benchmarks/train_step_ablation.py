"""Issue 51, item 2: each change of the new training step alone, paired in one process (one
thread, each step timed by its own CPU time, variants in shuffled rounds).

    python benchmarks/train_step_ablation.py gelu --model ViT-S/16 --batch-size 32 --precision bf16-autocast
    python benchmarks/train_step_ablation.py heap --model ViT-S/16 --batch-size 32 --precision fp32
    python benchmarks/train_step_ablation.py packed --model ViT-S/16 --batch-size 32 --precision bf16-autocast

gelu: the new step against the same step with PyTorch's GELU ($VITLAB_COMPILED_GELU=0 when built).
packed: the new step against the same step without oneDNN's packed weights ($VITLAB_PACKED_DENSE=0;
bf16: autocast's own products, fp32: oneDNN's on the plain layout).
heap: `kept_heap` as `vitlab train` holds it: per round, each variant starts from a heap given
back (`release_heap`) and runs two consecutive steps, the second timed, with and without it.
Prints each variant's seconds and page faults per step and the per-round ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import resource
import statistics
import time

import torch

from vitlab.api import get_config
from vitlab.bench.systems import Setting, System, prepare
from vitlab.deploy import training


def timed(fn) -> tuple[float, int]:
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.thread_time()
    fn()
    return time.thread_time() - t, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("change", choices=("gelu", "heap", "packed"))
    p.add_argument("--model", default="ViT-S/16")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--precision", default="bf16-autocast", choices=("fp32", "bf16-autocast"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--image-size", type=int, help="square images of this size (fine-tuning at 384: 384)")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = get_config(args.model)
    if args.image_size:
        cfg = cfg.replace(image_size=(args.image_size, args.image_size))
    setting = Setting(cfg, args.batch_size, "train")
    kept_heap = training.kept_heap
    if args.change == "heap":  # the step's own one-step use off: held here across two steps
        training.kept_heap = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]
    new = prepare(setting, System("vitlab", args.precision), warmup=1)
    calls = {}
    if args.change in ("gelu", "packed"):
        off = {"gelu": ("VITLAB_COMPILED_GELU", "PyTorch's GELU"), "packed": ("VITLAB_PACKED_DENSE", "unpacked weights")}
        var, name = off[args.change]
        os.environ[var] = "0"
        without = prepare(setting, System("vitlab", args.precision), warmup=1)
        del os.environ[var]
        calls = {"new step": lambda: timed(new.fn), name: lambda: timed(without.fn)}
    else:
        def steady(on: bool) -> tuple[float, int]:
            training.release_heap()
            with kept_heap(on):
                new.fn()
                return timed(new.fn)
        calls = {"new step": lambda: steady(True), "glibc's default heap": lambda: steady(False)}
    res: dict[str, list[tuple[float, int]]] = {k: [] for k in calls}
    rng = random.Random(0)
    for r in range(args.rounds):
        order = list(calls)
        rng.shuffle(order)
        for k in order:
            res[k].append(calls[k]())
        print(f"round {r + 1}:", {k: round(v[-1][0], 2) for k, v in res.items()}, flush=True)
    tag = f"{args.model} b{args.batch_size} {args.precision}"
    for k, v in res.items():
        print(f"{tag} {k}: s/step median {statistics.median(s for s, _ in v):.2f} {[round(s, 2) for s, _ in v]}, "
              f"page faults {[f for _, f in v]}")
    base, other = list(res)
    ratios = [o[0] / b[0] for b, o in zip(res[base], res[other], strict=True)]
    print(f"{tag}: the new step's speed over {other}'s, per round: median {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
