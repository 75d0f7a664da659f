"""Train a Vision Transformer (or the paper's BiT ResNet baseline, --model BiT-R50x1) as the
paper does (Adam, warm-up then decay, gradient clipping, inception crop + flip) from a
recipe: a YAML file, or the name of a shipped recipe (digits, fashion-mnist, cifar10,
cifar10-deit, vit-pretrain-imagenet21k, ...). Flags and
SECTION.KEY=VALUE overrides change it; the resolved config is written to the run folder
with metrics.jsonl, summary.json, checkpoints/, the learning curve and confusion matrix.
--log wandb|mlflow|tensorboard also sends the metrics to a tracker (off by default).

Rerunning the same command into the same --out folder continues from its newest checkpoint
(exactly: weights, optimiser, schedule, EMA, data position and random states). A different
config into an existing run folder is refused, never overwritten. --resume RUN --steps N
extends a run, finished or not, to N steps (the schedule becomes the N-step one from where
the run stands); other settings of a run cannot change on resume and are refused by name.

Regularisers of DeiT and "How to train your ViT" (AugReg): --mixup, --cutmix,
--randaugment N M, --label-smoothing, --drop-path (the cifar10-deit recipe sets them all).
Precision: --bf16 autocast (CPUs with bf16 units and GPUs); --fp16 autocast with a gradient
scaler on CUDA GPUs.

Many processes: torchrun --nproc_per_node N -m vitlab train ... (DDP; --fsdp shards the
model), or under Slurm srun -n N vitlab train ... (one process group from Slurm's
variables). --batch-size is the global batch.

SIGTERM or SIGUSR1 (train.stop_signals) stops a run at the end of its step with a checkpoint
and exit status 75, and the same command continues exactly; in a Slurm batch job SIGUSR1
(--signal=USR1@SECONDS, the notice before a time limit) also requeues the job (docs/cluster.md).

examples:
  vitlab train                                   # digits, about a minute on 2 CPU cores
  vitlab train --config cifar10 --data wds:../shared/data/cifar10 --out runs/cifar10
  vitlab train --config cifar10-deit --data wds:../shared/data/cifar10 --out runs/cifar10-deit
  vitlab train --data fashion-mnist --config fashion-mnist --epochs 2
  vitlab train --data imagefolder:~/pets --model ViT-S/16 --image-size 224 --batch-size 64 \\
      --mixup 0.8 --cutmix 1.0 --randaugment 2 9 --drop-path 0.1 optim.weight_decay=0.05
  vitlab train --config vit-pretrain-imagenet21k --data wds:/data/in21k/train-{000000..002047}.tar
  vitlab train --config cifar10 --data wds:../shared/data/cifar10 --model BiT-R26-C --train-fraction 0.1
  vitlab train --resume runs/digits --steps 880  # extend a finished run to 880 steps
  vitlab train --log tensorboard --log wandb     # WANDB_MODE=offline keeps wandb on disk
  torchrun --nproc_per_node 2 -m vitlab train --batch-size 128
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitlab.cli.common import FOLDER

WRITES = {"out": FOLDER}  # checked writable before any work (vitlab.cli.check_arguments)
RESUMABLE = True  # stopped, the same command continues from the last checkpoint
READS_DATA = True  # data specs from files may name a pipe: command (--allow-pipe)
HELP = "train a ViT or a BiT ResNet from a recipe (default: a small ViT on the built-in digits, on CPU)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from vitlab.cli.common import add_training_arguments

    add_training_arguments(p, "digits")
    p.set_defaults(config=None)  # so that --resume RUN can tell a given --config from the default
    p.add_argument("--model", metavar="NAME", help="a variant from `vitlab models`, or timm's or Hugging Face's name for one "
                   "(vit_tiny_patch16_224, google/vit-base-patch16-224); replaces the recipe's model shape, keeps its dropout")
    p.add_argument("--objective", help="training objective (train.objective): supervised, mpp")
    p.add_argument("--resume", nargs="?", const=True, metavar="RUN_DIR",
                   help="continue the run in RUN_DIR (or --out) from its newest checkpoint; with --steps/--epochs, "
                   "extend a finished run")


def run(args: argparse.Namespace) -> int:
    from vitlab.cli.common import command_line, given, training_exit
    from vitlab.config import ConfigError, load_recipe
    from vitlab.run_layout import RunLayout
    from vitlab.train import recipe
    from vitlab.train.inputs import Inputs

    if isinstance(args.resume, str):
        out = Path(args.resume)
        cfg = recipe.resume_config(out, given(args), recipe=args.config, out=args.out)
    else:
        name = args.config or recipe.DEFAULT_RECIPE
        cfg = recipe.resolve(load_recipe(name), given(args))
        out = Path(args.out or Path("runs") / Path(name).stem)  # runs/RECIPE by default
        if args.resume and not RunLayout(out).last.exists():  # --resume without a run folder: out's checkpoint
            raise ConfigError(f"--resume: {out} has no checkpoint to continue from; drop --resume to start the run")
    return training_exit(lambda: recipe.train(cfg, out, Inputs(), command=command_line(), quiet=args.quiet,
                                              trackers=args.log or (), extend=bool(args.resume)))
