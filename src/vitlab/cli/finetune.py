"""`vitlab finetune`: transfer a pretrained ViT to a new dataset, as the paper does."""

from __future__ import annotations

import argparse
from pathlib import Path

from vitlab.cli.train import add_common, execute, resolve

HELP = "fine-tune a checkpoint on a new dataset at a higher resolution (the paper's protocol)"
DESCRIPTION = """\
Fine-tune any checkpoint vitlab.load reads (a vitlab run, an official .npz, timm or Hugging
Face weights) on a dataset, the paper's way (§3.2, Appendix B.1.1): the pretrained head and
pre-logits are dropped for a fresh zero-initialised head, the position embeddings are
resized to --image-size, SGD with momentum 0.9, cosine decay, no weight decay, clipping at 1,
batch 512, and Table 4's number of steps for the dataset (CIFAR 10k, ImageNet 20k, Pets and
Flowers 500) unless --steps/--epochs say otherwise.

--lr-sweep runs the paper's protocol: Table 4's learning-rate grid, each trained on the
training set minus a dev split (2% of CIFAR, 10% of others) and scored on the dev split, then
the best rate trained on the full training set (in OUT/final; OUT/sweep.json has the scores).

examples:
  vitlab finetune --from runs/cifar10/checkpoints/last.safetensors --data cifar10:~/data --image-size 48 --steps 200
  vitlab finetune --from vit_b16_in21k.npz --data imagefolder:~/pets --image-size 384 --lr-sweep
  vitlab finetune --from runs/digits/checkpoints/last.safetensors --data digits --image-size 24 \\
      --steps 100 --batch-size 64 optim.warmup_steps=10
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="checkpoint", required=True, metavar="CHECKPOINT",
                   help="pretrained weights: any file vitlab.load reads")
    add_common(p, "finetune")
    p.add_argument("--lr-sweep", action="store_true", help="choose the learning rate on a dev split first (Table 4's grid)")
    p.add_argument("--table4", metavar="DATASET", help="which Table 4 row (steps, LR grid) applies: cifar10, cifar100, "
                   "imagenet, pets, flowers, vtab (default: guessed from --data)")


def run(args: argparse.Namespace) -> int:
    from vitlab.checkpoints import is_pretrained_name
    from vitlab.cli import UsageError
    from vitlab.data import paper_dataset
    from vitlab.train import finetune

    if not Path(args.checkpoint).exists() and not is_pretrained_name(args.checkpoint):
        raise UsageError(f"--from {args.checkpoint}: no such file")
    extra = {"model.checkpoint": args.checkpoint}
    data = args.data
    if data is None:
        raise UsageError("--data is required: the dataset to fine-tune on (e.g. --data cifar10)")
    row = args.table4 or paper_dataset(data)
    if row is not None and row not in finetune.TABLE4_STEPS:
        raise UsageError(f"--table4 {row!r}: not a Table 4 dataset; use one of {', '.join(finetune.TABLE4_STEPS)}")
    if args.steps is None and args.epochs is None:
        from vitlab.config import load_recipe

        if load_recipe(args.config).train.steps == 0:
            if row is None:
                raise UsageError(
                    f"no Table 4 step count for {data!r}: pass --steps N (or --table4 cifar10|imagenet|pets|...)"
                )
            extra["train.steps"] = finetune.TABLE4_STEPS[row]
    cfg, recipe = resolve(args, extra)
    out = Path(args.out or f"runs/{recipe}-{Path(args.checkpoint).stem}")
    if not args.lr_sweep:
        return execute(cfg, out, args.quiet)

    from vitlab.train.loop import Trainer

    grid = finetune.TABLE4_LRS.get(row or "", (0.001, 0.003, 0.01, 0.03))
    result = finetune.lr_sweep(cfg, out, grid, lambda c, o: Trainer(c, o, quiet=args.quiet).run())
    print(f"lr-sweep done: best lr {result['best_lr']:g}; scores in {out / 'sweep.json'}; final run in {out / 'final'}")
    return 0
