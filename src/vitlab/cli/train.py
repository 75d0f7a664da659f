"""`vitlab train`: train a ViT from a recipe, with command-line overrides."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

HELP = "train a ViT or a BiT ResNet from a recipe (default: a small ViT on the built-in digits, on CPU)"
DESCRIPTION = """\
Train a Vision Transformer (or the paper's BiT ResNet baseline, --model BiT-R50x1) as the
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
model). --batch-size is the global batch.

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

# Model keys kept when --model swaps the variant: regularisation, not shape.
KEEP_WITH_MODEL = ("dropout", "attention_dropout", "drop_path")

# Flag -> the config key it sets (flags whose value is the key's value).
FLAG_KEYS = {
    "data": "data.name", "image_size": "model.image_size", "batch_size": "train.batch_size",
    "micro_batch_size": "train.micro_batch_size", "lr": "optim.lr", "warmup_steps": "optim.warmup_steps",
    "seed": "train.seed", "ckpt_every": "train.ckpt_every", "eval_every": "train.eval_every",
    "workers": "data.num_workers", "skip_bad_images": "data.skip_bad_images", "ema": "train.ema",
    "compile": "train.compile", "grad_checkpointing": "train.grad_checkpointing", "device": "train.device",
    "objective": "train.objective", "mixup": "train.mixup", "cutmix": "train.cutmix",
    "label_smoothing": "train.label_smoothing", "drop_path": "model.drop_path",
    "train_fraction": "data.train_fraction", "train_size": "data.train_size",
}


def add_common(p: argparse.ArgumentParser, default_recipe: str) -> None:
    from vitlab.train.tracking import TRACKERS

    p.add_argument("--config", default=default_recipe, metavar="RECIPE",
                   help=f"a recipe YAML file or a shipped recipe's name (default: {default_recipe})")
    p.add_argument("--data", metavar="SPEC", help="digits | fashion-mnist[:DIR] | cifar10[:DIR] | cifar100[:DIR] | "
                   "imagefolder:PATH | wds:PATTERN | hf:NAME (a Hugging Face dataset)")
    p.add_argument("--image-size", type=int, metavar="N", help="training resolution (model.image_size)")
    subset = p.add_mutually_exclusive_group()
    subset.add_argument("--train-fraction", type=float, metavar="F", help="train on a fixed, class-balanced share "
                        "F of the training split, the same in every run (data.train_fraction)")
    subset.add_argument("--train-size", type=int, metavar="N", help="... or on N images of it (data.train_size)")
    p.add_argument("--batch-size", type=int, metavar="N", help="global batch size (train.batch_size)")
    p.add_argument("--micro-batch-size", type=int, metavar="N", help="per process and forward pass; the rest is "
                   "gradient accumulation")
    p.add_argument("--lr", type=float, help="peak learning rate (optim.lr)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=float, help="train for this many epochs")
    length.add_argument("--steps", type=int, help="train for this many optimiser steps")
    p.add_argument("--warmup-steps", type=int, help="linear warm-up steps (optim.warmup_steps)")
    p.add_argument("--seed", type=int, help="random seed (train.seed)")
    p.add_argument("--out", metavar="DIR", help="the run folder (default: runs/RECIPE)")
    p.add_argument("--ckpt-every", type=int, metavar="STEPS", help="write a checkpoint every STEPS steps")
    p.add_argument("--eval-every", type=int, metavar="STEPS", help="evaluate every STEPS steps (0: at the end)")
    p.add_argument("--workers", type=int, metavar="N", help="data-loader worker processes (data.num_workers)")
    p.add_argument("--skip-bad-images", action="store_true", default=None,
                   help="skip and count unreadable images instead of stopping with the file's name")
    reg = p.add_argument_group("regularisation (DeiT, and Steiner et al.'s \"How to train your ViT\")")
    reg.add_argument("--mixup", type=float, metavar="ALPHA", help="Mixup with Beta(ALPHA, ALPHA) (train.mixup; DeiT 0.8)")
    reg.add_argument("--cutmix", type=float, metavar="ALPHA", help="CutMix with Beta(ALPHA, ALPHA) (train.cutmix; DeiT "
                     "1.0); with --mixup, one of the two per batch")
    reg.add_argument("--randaugment", type=int, nargs=2, metavar=("N", "M"),
                     help="RandAugment: N ops of magnitude M per image (data.randaugment, data.randaugment_magnitude; "
                     "DeiT 2 9)")
    reg.add_argument("--label-smoothing", type=float, metavar="EPS", help="label smoothing (train.label_smoothing; 0.1)")
    reg.add_argument("--drop-path", type=float, metavar="RATE", help="stochastic depth, largest rate at the last block "
                     "(model.drop_path; DeiT 0.1)")
    reg.add_argument("--ema", type=float, nargs="?", const=0.9999, metavar="DECAY",
                     help="Polyak averaging of the weights (default decay 0.9999, the paper's)")
    precision = p.add_mutually_exclusive_group()
    precision.add_argument("--bf16", action="store_true", default=None, help="bfloat16 autocast (train.precision=bf16)")
    precision.add_argument("--fp16", action="store_true", default=None,
                           help="float16 autocast with a gradient scaler, on CUDA GPUs (train.precision=fp16)")
    p.add_argument("--grad-checkpointing", action="store_true", default=None,
                   help="recompute block activations in the backward pass to save memory")
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile the training step")
    p.add_argument("--fsdp", action="store_true", default=None, help="under torchrun: shard the model (FSDP)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")
    p.add_argument("--log", action="append", choices=TRACKERS, metavar="TRACKER",
                   help=f"also log to {', '.join(TRACKERS)} (repeatable; off by default; each is a pip extra)")
    p.add_argument("--quiet", action="store_true", help="print only the final summary")
    p.add_argument("overrides", nargs="*", metavar="SECTION.KEY=VALUE",
                   help="change any recipe value, e.g. optim.weight_decay=0.05 model.dropout=0.1")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p, "digits")
    p.set_defaults(config=None)  # so that --resume RUN can tell a given --config from the default
    p.add_argument("--model", metavar="NAME", help="a variant from `vitlab models` (replaces the recipe's model "
                   "shape; keeps its dropout settings)")
    p.add_argument("--objective", help="training objective (train.objective): supervised, mpp")
    p.add_argument("--resume", nargs="?", const=True, metavar="RUN_DIR",
                   help="continue the run in RUN_DIR (or --out) from its newest checkpoint; with --steps/--epochs, "
                   "extend a finished run")


def given_flags(args: argparse.Namespace) -> list[tuple[str, str, Any]]:
    """(flag as typed, config key, value) for every flag given, in the order of FLAG_KEYS."""
    given = []
    for attr, key in FLAG_KEYS.items():
        value = getattr(args, attr, None)
        if value is not None:
            given.append((f"--{attr.replace('_', '-')}", key, value))
    if getattr(args, "epochs", None) is not None:
        given += [("--epochs", "train.epochs", args.epochs), ("--epochs", "train.steps", 0)]
    if getattr(args, "steps", None) is not None:
        given.append(("--steps", "train.steps", args.steps))
    if getattr(args, "randaugment", None) is not None:
        given += [("--randaugment", "data.randaugment", args.randaugment[0]),
                  ("--randaugment", "data.randaugment_magnitude", args.randaugment[1])]
    for flag, value in (("bf16", "bf16"), ("fp16", "fp16")):
        if getattr(args, flag, None):
            given.append((f"--{flag}", "train.precision", value))
    if getattr(args, "fsdp", None):
        given.append(("--fsdp", "train.parallel", "fsdp"))
    return given


def flag_overrides(args: argparse.Namespace) -> dict:
    """The flags as SECTION.KEY overrides (command-line overrides are applied after them)."""
    return {key: value for _, key, value in given_flags(args)}


def resolve(args: argparse.Namespace, extra: dict | None = None):
    """Recipe + flags + overrides -> (RunConfig, recipe name)."""
    from vitlab.cli import UsageError
    from vitlab.config import RunConfig, load_recipe, parse_override

    name = args.config or "digits"
    recipe = load_recipe(name)
    d = recipe.to_dict()
    if getattr(args, "model", None):
        from vitlab.api import get_config

        keep = KEEP_WITH_MODEL if get_config(args.model).kind == "vit" else ()  # a BiT ResNet has no dropout
        d["model"] = {"name": args.model, **{k: v for k, v in d["model"].items() if k in keep}}
    if args.data:
        d["data"]["eval_data"] = ""  # the recipe's evaluation set belongs to its own data
    cfg = RunConfig.from_dict(d).with_overrides({**(extra or {}), **flag_overrides(args)})
    parsed = dict(parse_override(o) for o in args.overrides)
    cfg = cfg.with_overrides(parsed)
    if cfg.train.steps == 0 and cfg.train.epochs == 0:
        raise UsageError("the recipe sets no length: pass --steps N or --epochs N")
    return cfg, Path(name).stem


def resume_config(args: argparse.Namespace, run_dir: Path):
    """The config of the run in `run_dir` with what may change on resume applied: the length
    (extending the run), checkpoints, workers, device and threads. Any other flag or override
    is refused by name rather than ignored: it would change the numbers of a run half done."""
    import yaml

    from vitlab.cli import UsageError
    from vitlab.config import RunConfig, parse_override
    from vitlab.train.loop import EXTENDABLE
    from vitlab.train.run_folder import RESUMABLE_CHANGES

    if not (run_dir / "config.yaml").is_file():
        raise UsageError(f"--resume {run_dir}: no config.yaml there; give a run folder written by vitlab train")
    changeable = RESUMABLE_CHANGES | EXTENDABLE
    given = [(flag, key, value) for flag, key, value in given_flags(args)]
    given += [(o, *parse_override(o)) for o in args.overrides]
    refused = list(dict.fromkeys(flag for flag, key, _ in given if key not in changeable))
    if args.config is not None:
        refused.insert(0, "--config")
    for flag in ("model",):
        if getattr(args, flag, None):
            refused.insert(0, f"--{flag}")
    if args.out and Path(args.out).resolve() != run_dir.resolve():
        refused.append("--out")
    if refused:
        allowed = "--steps, --epochs, --ckpt-every, --workers, --device, --log, --quiet"
        raise UsageError(
            f"--resume {run_dir} continues that run with its own config; {', '.join(refused)} would change it. "
            f"On resume only {allowed} and {', '.join(sorted(RESUMABLE_CHANGES))} may change; for other settings "
            "start a new run with another --out"
        )
    cfg = RunConfig.from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
    return cfg.with_overrides({key: value for _, key, value in given})


def command_line() -> str:
    return "vitlab " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def run(args: argparse.Namespace) -> int:
    from vitlab.cli import UsageError

    trackers = tuple(args.log or ())
    if isinstance(args.resume, str):
        run_dir = Path(args.resume)
        return execute(resume_config(args, run_dir), run_dir, args.quiet, trackers=trackers, extend=True)
    cfg, recipe = resolve(args)
    out = Path(args.out or f"runs/{recipe}")
    if args.resume and not (out / "checkpoints" / "last.safetensors").exists():
        raise UsageError(f"--resume: {out} has no checkpoint to continue from; drop --resume to start the run")
    return execute(cfg, out, args.quiet, trackers=trackers, extend=bool(args.resume))


def execute(cfg, out: Path, quiet: bool = False, notes: list[str] | tuple[str, ...] = (),
            trackers: tuple[str, ...] = (), extend: bool = False) -> int:
    from vitlab.data import BadImageError
    from vitlab.train.loop import Trainer, TrainingDiverged

    try:
        Trainer(cfg, out, command=command_line(), quiet=quiet, notes=tuple(notes), trackers=trackers,
                extend=extend).run()
    except TrainingDiverged as e:
        print(f"vitlab train: stopped: {e}", file=sys.stderr)
        return 3
    except BadImageError as e:  # names the file; the checkpoints written so far are kept
        from vitlab.cli.common import bad_image_message

        print(f"vitlab train: error: {bad_image_message(e)}", file=sys.stderr)
        return 2
    return 0
