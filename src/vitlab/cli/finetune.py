"""Fine-tune any checkpoint vitlab.load reads (a vitlab run, an official .npz, timm or Hugging
Face weights, a name such as hf-hub:ORG/NAME) on a dataset: the pretrained head and
pre-logits are dropped for a fresh zero-initialised head, cosine decay, clipping at 1, and
Table 4's number of steps for the dataset (CIFAR 10k, ImageNet 20k, Pets and Flowers 500;
500 for data Table 4 does not list) unless --steps/--epochs say otherwise.

The recipe (--recipe): by default (auto, with the shipped finetune recipe; another --config
is followed as it is, and so is --table4's: Table 4's protocol) a quick sweep chooses it on a
dev split, between
  - paper: the paper's (§3.2, Appendix B.1.1): SGD with momentum 0.9, no weight decay, the
    inception crop, at each rate of Table 4's grid (0.001-0.03), and
  - adamw: the recipe vitlab trains from scratch with: AdamW, weight decay 0.05, but on the
    whole image unflipped and without label smoothing (a short run on crops, mirror images or
    smoothed labels undoes the probe head it starts from), at 0.0003 and 0.001, and the new head started as the linear
    probe of the frozen features (logistic regression on up to 500 training images per
    class, as vitlab linear-probe fits it; model.head_start=probe, its forward passes
    counted as compute; model.head_start=zeros for the paper's zero head).
Each of the six arms trains for 5% of the steps (at least 10) on the training set minus the
dev split (2% of CIFAR, 1% of ImageNet, 10% of others, told by the data's identity) and is
scored on the dev split; the best trains on the whole set. The plan line says which recipe
won, by how much and with what noise; the sweep's steps count as compute (OUT/final/
summary.json: compute_with_sweep). --recipe paper is the paper's protocol as it was (a
quick sweep of Table 4's rates on a training set of up to 20,000 images, else the recipe's
0.003); --lr skips the sweep (the paper's recipe, or AdamW with --recipe adamw).

The rest is fitted to the checkpoint and the data, and the plan line says what was chosen:
  - resolution: the checkpoint's own. The paper fine-tunes at a higher resolution than it
    pre-trains (224 -> 384, position embeddings resized): --paper-resolution takes that step
    (x384/224), --image-size N any other. It pays when the target images hold detail finer
    than the pre-training patches resolve (photos larger than the pre-training size), at
    about (384/224)^2 = 3x the tokens and more than 3x the compute per step; upsampling small
    images (CIFAR's 32 px, digits' 8 px) adds cost and no information;
  - threads and data workers: the source run's own (a vitlab run folder's config.yaml),
    else the recipe's;
  - warm-up: 5% of the run with the paper's recipe (its 500 of 10,000 steps), 25% with AdamW;
  - batch: the recipe's 512, kept as the paper keeps it on its smallest set (Flowers, 2,040
    images); where it is more than a quarter of the training set it runs as micro-batches of
    at most a quarter (gradient accumulation: the same update, e.g. 512 as 2 x 256 on 1,437
    images), and a training set smaller than one batch gets the largest power of two at most
    a quarter of it;
  - progress: a line after the first step and then every 10 s at least.

--lr-sweep runs the sweep in full: every arm (or, with --recipe paper, Table 4's rates or
--lr-grid) trained for the whole run, then the best on the full training set. It says so
when the best rate is at the edge of the grid, and when the winner's dev score is within
sampling noise of the runner-up's (the pick is then uncertain). Sweeps write OUT/sweep/*/ and
the final run OUT/final/ (OUT/sweep.json has the scores).

examples:
  vitlab finetune runs/cifar10/checkpoints/last.safetensors --data digits
  vitlab finetune runs/cifar10/checkpoints/last.safetensors --data digits --recipe paper
  vitlab finetune runs/cifar10/checkpoints/last.safetensors --data cifar10:~/data --paper-resolution --steps 200
  vitlab finetune vit_b16_in21k.npz --data imagefolder:~/pets --table4 pets --image-size 384 --lr-sweep
  vitlab finetune hf-hub:google/vit-base-patch16-224-in21k --data imagefolder:~/photos --lr 0.01
"""

from __future__ import annotations

import argparse

from vitlab.cli.common import COUNT, FOLDER

WRITES = {"out": FOLDER}  # checked writable before any work (vitlab.cli.check_arguments)
RESUMABLE = True  # stopped, the same command continues from the last checkpoint
READS_DATA = True  # data specs from files may name a pipe: command (--allow-pipe)
HELP = "fine-tune a checkpoint on a new dataset (the recipe chosen on a dev split, fitted to the checkpoint and the data)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from vitlab.cli.common import add_training_arguments

    p.add_argument("checkpoint", nargs="?", help="pretrained weights: a file vitlab.load reads, or a name (hf-hub:...)")
    p.add_argument("--from", dest="source", metavar="CHECKPOINT", help="the same, as a flag (the earlier form)")
    add_training_arguments(p, "finetune")
    p.add_argument("--paper-resolution", action="store_true",
                   help="fine-tune at the paper's step up from the checkpoint's resolution (x384/224, e.g. 224 -> 384)")
    p.add_argument("--lr-sweep", action="store_true", help="choose the learning rate on a dev split first (Table 4's grid)")
    p.add_argument("--lr-grid", metavar="LR,LR,...", help="the rates a sweep tries (default: Table 4's for the dataset)")
    p.add_argument("--recipe", choices=("auto", "paper", "adamw"),
                   help="the fine-tuning recipe: auto chooses between the paper's SGD and AdamW on a dev split (the "
                   "default with the shipped finetune recipe); paper: the paper's protocol, or --config's recipe as "
                   "it is (the default with any other --config); adamw: vitlab's from-scratch recipe")
    p.add_argument("--random-init", type=int, metavar="SEED", help="the control arm: start from the checkpoint's "
                   "network at random init (written beside --out), the same fine-tuning from untrained weights")
    p.add_argument("--repeats", type=COUNT, default=1, metavar="N", help="fine-tune N times with seeds seed..seed+N-1 "
                   "(OUT/seed-K) and report top-1 as mean ± std, as Table 2 does (a sweep runs once, with seed 0)")
    p.add_argument("--table4", metavar="DATASET", help="run Table 4's protocol for this row (the paper's recipe, its "
                   "steps and LR grid, warm-up 500): cifar10, cifar100, imagenet, pets, flowers, vtab (default: the row "
                   "guessed from --data, for the steps and grid only)")


def make_plan(args: argparse.Namespace):
    """The command's finetune.Plan (what docs/reproducing.md's commands are checked by): the
    flags made into finetune.Settings here, once."""
    from vitlab.cli.common import given, lr_rates
    from vitlab.config import ConfigError
    from vitlab.train import finetune
    from vitlab.train.inputs import Inputs

    checkpoint = args.source or args.checkpoint  # `--from CHECKPOINT`, the earlier form, or the positional
    if args.source and args.checkpoint and "=" not in args.checkpoint:
        raise ConfigError(f"{args.checkpoint} and --from {args.source} both name the checkpoint: give one")
    if args.source and args.checkpoint:  # with --from, the first word after the command is an override
        args.overrides.insert(0, args.checkpoint)
    if not checkpoint:
        raise ConfigError("give the checkpoint to fine-tune: vitlab finetune CHECKPOINT --data SPEC")
    if args.random_init is not None:
        checkpoint = finetune.random_start(checkpoint, args.random_init, args.out)
    return finetune.plan(finetune.Settings(
        checkpoint, args.data, given(args), recipe=args.config, choose=args.recipe, paper_resolution=args.paper_resolution,
        lr_sweep=args.lr_sweep, rates=lr_rates(args.lr_grid), table4=args.table4, out=args.out), Inputs())


def run(args: argparse.Namespace) -> int:
    from vitlab.cli.common import command_line, training_exit
    from vitlab.train import finetune

    plan = make_plan(args)
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
    if code == 0 and finetune.done_line(plan, result):
        print(finetune.done_line(plan, result))
    return code
