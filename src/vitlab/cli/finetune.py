"""`vitlab finetune`: transfer a pretrained ViT to a new dataset, as the paper does."""

from __future__ import annotations

import argparse
from pathlib import Path

from vitlab.cli.train import add_common, command_line, execute, resolve

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

# Flags whose value, when given, the fitted defaults leave alone.
EXPLICIT_FLAGS = {"batch_size": "train.batch_size", "warmup_steps": "optim.warmup_steps", "lr": "optim.lr",
                  "image_size": "model.image_size"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="checkpoint", required=True, metavar="CHECKPOINT",
                   help="pretrained weights: any file vitlab.load reads, or a name (hf-hub:, timm:, MODEL:WEIGHTS)")
    add_common(p, "finetune")
    p.add_argument("--paper-resolution", action="store_true",
                   help="fine-tune at the paper's step up from the checkpoint's resolution (x384/224, e.g. 224 -> 384)")
    p.add_argument("--lr-sweep", action="store_true", help="choose the learning rate on a dev split first (Table 4's grid)")
    p.add_argument("--lr-grid", metavar="LR,LR,...", help="the rates a sweep tries (default: Table 4's for the dataset)")
    p.add_argument("--table4", metavar="DATASET", help="which Table 4 row (steps, LR grid) applies: cifar10, cifar100, "
                   "imagenet, pets, flowers, vtab (default: guessed from --data)")


def explicit_keys(args: argparse.Namespace) -> set[str]:
    """The config keys the user set by flag or SECTION.KEY=VALUE."""
    keys = {key for attr, key in EXPLICIT_FLAGS.items() if getattr(args, attr, None) is not None}
    keys |= {o.split("=", 1)[0].strip() for o in args.overrides if "=" in o}
    return keys | ({"model.image_size"} if args.paper_resolution else set())


def _grid(args, row) -> tuple[float, ...]:
    from vitlab.cli import UsageError
    from vitlab.train import finetune

    if not args.lr_grid:
        return finetune.TABLE4_LRS.get(row or "", finetune.DEFAULT_GRID)
    try:
        grid = tuple(float(v) for v in args.lr_grid.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"--lr-grid {args.lr_grid!r}: give rates separated by commas, e.g. 0.001,0.003,0.01") from None
    if not grid or min(grid) <= 0:
        raise UsageError(f"--lr-grid {args.lr_grid!r}: give positive rates separated by commas")
    return grid


def _length(args, row, extra: dict, notes: list[str]) -> None:
    from vitlab.cli import UsageError
    from vitlab.config import load_recipe
    from vitlab.train import finetune

    if row is not None and row not in finetune.TABLE4_STEPS:
        raise UsageError(f"--table4 {row!r}: not a Table 4 dataset; use one of {', '.join(finetune.TABLE4_STEPS)}")
    if args.steps is None and args.epochs is None and load_recipe(args.config).train.steps == 0:
        if row is None:
            extra["train.steps"] = finetune.DEFAULT_STEPS
            notes.append(f"{finetune.DEFAULT_STEPS} steps: Table 4's count for its small datasets (--steps N to change)")
        else:
            extra["train.steps"] = finetune.TABLE4_STEPS[row]


def _train_size(cfg, arch) -> int:
    from vitlab.data import open_dataset
    from vitlab.data.transforms import model_transform

    return len(open_dataset(cfg.data.name, cfg.data.train_split, model_transform(arch)))


def run(args: argparse.Namespace) -> int:
    from vitlab.checkpoints import is_pretrained_name, read_checkpoint
    from vitlab.cli import UsageError
    from vitlab.data import paper_dataset
    from vitlab.train import finetune
    from vitlab.train.build import architecture

    if not Path(args.checkpoint).exists() and not is_pretrained_name(args.checkpoint):
        raise UsageError(f"--from {args.checkpoint}: no such file")
    if args.data is None:
        raise UsageError("--data is required: the dataset to fine-tune on (e.g. --data cifar10)")
    if args.paper_resolution and args.image_size:
        raise UsageError("--paper-resolution and --image-size both set the resolution: give one")
    extra: dict = {"model.checkpoint": args.checkpoint}
    notes: list[str] = []
    row = args.table4 or paper_dataset(args.data)
    grid = _grid(args, row)
    _length(args, row, extra, notes)
    if args.paper_resolution:
        own = read_checkpoint(args.checkpoint).config
        extra["model.image_size"] = finetune.paper_resolution(own.image_size, own.total_stride)
    cfg, recipe = resolve(args, extra)
    arch = architecture(cfg.model)
    explicit = explicit_keys(args)
    fitted = finetune.fit_defaults(cfg, _train_size(cfg, arch), explicit, args.lr_sweep)
    notes = [finetune.resolution_note(arch.image_size, "model.image_size" in explicit), *fitted.notes, *notes]
    out = Path(args.out or f"runs/{recipe}-{Path(args.checkpoint).stem}")
    if not args.lr_sweep and fitted.quick_sweep_steps is None:
        return execute(fitted.config, out, args.quiet, notes, trackers=tuple(args.log or ()))

    from vitlab.train.loop import Trainer

    print("\n  ".join(("fine-tuning defaults, for the sweep and the final run:", *notes)), flush=True)

    def train(c, o):
        sweeping = o.parent.name == "sweep"
        said = (f"lr-sweep run: lr {c.optim.lr:g}, {c.train.steps} steps, scored on the dev split",) if sweeping else notes
        return Trainer(c, o, command=command_line(), quiet=args.quiet, notes=tuple(said),
                       trackers=tuple(args.log or ())).run()

    result = finetune.lr_sweep(fitted.config, out, grid, train, sweep_steps=fitted.quick_sweep_steps)
    print(f"lr-sweep done: best lr {result['best_lr']:g}; scores in {out / 'sweep.json'}; final run in {out / 'final'}")
    return 0
