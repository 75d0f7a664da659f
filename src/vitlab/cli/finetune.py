"""`vitlab finetune`: transfer a pretrained ViT to a new dataset, as the paper does."""

from __future__ import annotations

import argparse

HELP = "fine-tune a checkpoint on a new dataset (the paper's protocol, fitted to the checkpoint and the data)"
DESCRIPTION = """\
Fine-tune any checkpoint vitlab.load reads (a vitlab run, an official .npz, timm or Hugging
Face weights, a name such as hf-hub:ORG/NAME) on a dataset, the paper's way (§3.2, Appendix
B.1.1): the pretrained head and pre-logits are dropped for a fresh zero-initialised head,
SGD with momentum 0.9, cosine decay, no weight decay, clipping at 1, and Table 4's number of
steps for the dataset (CIFAR 10k, ImageNet 20k, Pets and Flowers 500; 500 for data Table 4
does not list) unless --steps/--epochs say otherwise.

The paper's numbers are for 224 px ImageNet models on large targets; with only --from and
--data the rest is fitted to the checkpoint and the data, and the plan line says what was
chosen and why:
  - resolution: the checkpoint's own. The paper fine-tunes at a higher resolution than it
    pre-trains (224 -> 384, position embeddings resized): --paper-resolution takes that step
    (x384/224), --image-size N any other. It pays when the target images hold detail finer
    than the pre-training patches resolve (photos larger than the pre-training size), at
    about (384/224)^2 = 3x the tokens and more than 3x the compute per step; upsampling small
    images (CIFAR's 32 px, digits' 8 px) adds cost and no information;
  - warm-up: at most 5% of the run (the paper's 500 of 10,000 steps);
  - batch: the recipe's 512, or less: a power of two at most a quarter of the training set
    (at least 4 steps an epoch, as the paper's smallest set, Flowers);
  - learning rate: on a training set of up to 20,000 images, a quick sweep first (Table 4's
    grid, each rate trained for a tenth of the steps on the training set minus a dev
    split and scored on the dev split), then the best rate on the whole set; on larger
    sets the recipe's 0.003, which can be far from the best: use --lr-sweep;
  - progress: a line after the first step and then every 10 s at least.

--lr-sweep runs the paper's protocol in full: Table 4's learning-rate grid (or --lr-grid),
each trained for the whole run on the training set minus a dev split (2% of CIFAR, 10% of
others) and scored on the dev split, then the best rate trained on the full training set.
It says so when the best rate is at the edge of the grid, and when its dev score is within
sampling noise of the runner-up's (the pick is then uncertain). Sweeps write OUT/sweep/lr-*/ and
the final run OUT/final/ (OUT/sweep.json has the scores).

examples:
  vitlab finetune --from runs/cifar10/checkpoints/last.safetensors --data digits
  vitlab finetune --from runs/cifar10/checkpoints/last.safetensors --data cifar10:~/data --paper-resolution --steps 200
  vitlab finetune --from vit_b16_in21k.npz --data imagefolder:~/pets --image-size 384 --lr-sweep
  vitlab finetune --from hf-hub:google/vit-base-patch16-224-in21k --data imagefolder:~/photos --lr 0.01
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from vitlab.cli.common import add_training_arguments

    p.add_argument("--from", dest="checkpoint", required=True, metavar="CHECKPOINT",
                   help="pretrained weights: any file vitlab.load reads, or a name (hf-hub:, timm:, MODEL:WEIGHTS)")
    add_training_arguments(p, "finetune")
    p.add_argument("--paper-resolution", action="store_true",
                   help="fine-tune at the paper's step up from the checkpoint's resolution (x384/224, e.g. 224 -> 384)")
    p.add_argument("--lr-sweep", action="store_true", help="choose the learning rate on a dev split first (Table 4's grid)")
    p.add_argument("--lr-grid", metavar="LR,LR,...", help="the rates a sweep tries (default: Table 4's for the dataset)")
    p.add_argument("--repeats", type=int, default=1, metavar="N", help="fine-tune N times with seeds seed..seed+N-1 "
                   "(OUT/seed-K) and report top-1 as mean ± std, as Table 2 does (a sweep runs once, with seed 0)")
    p.add_argument("--table4", metavar="DATASET", help="which Table 4 row (steps, LR grid) applies: cifar10, cifar100, "
                   "imagenet, pets, flowers, vtab (default: guessed from --data)")


def rates(text: str | None) -> list[float] | None:
    """--lr-grid's rates, or None for Table 4's."""
    from vitlab.cli import UsageError

    if not text:
        return None
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--lr-grid {text!r}: give rates separated by commas, e.g. 0.001,0.003,0.01") from None


def run(args: argparse.Namespace) -> int:
    from vitlab.cli.common import command_line, training_exit
    from vitlab.train import finetune

    plan = finetune.plan(args.checkpoint, args.data, recipe=args.config, options=vars(args), overrides=args.overrides,
                         paper_resolution=args.paper_resolution, lr_sweep=args.lr_sweep, rates=rates(args.lr_grid),
                         table4=args.table4, out=args.out)
    result: dict = {}

    def one(p):
        return finetune.run(p, command=command_line(), quiet=args.quiet, trackers=args.log or ())

    if args.repeats > 1:
        from vitlab.train import repeats

        code = training_exit(lambda: result.update(repeats.repeat(plan, args.repeats, one)), "finetune")
        if code == 0:
            print(f"{repeats.report(result)}; every run in {plan.out / 'repeats.json'}")
        return code
    code = training_exit(lambda: result.update(one(plan)), "finetune")
    if code == 0 and "best_lr" in result:
        print(f"lr-sweep done: best lr {result['best_lr']:g}; scores in {plan.out / 'sweep.json'}; "
              f"final run in {plan.out / 'final'}")
    return code
