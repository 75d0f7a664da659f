"""What the commands share: the arguments several of them take, progress on stderr, how a
training ends as an exit status, results as JSON, and small parsers of argument values. The
work itself is the library's (vitlab.checkpoints.open_checkpoint, vitlab.data.image_files,
vitlab.eval.features, vitlab.train.recipe, ...)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

# What a command writes, declared by the command module as WRITES = {argument: kind}; the
# dispatcher checks each before any work (vitlab.files.check_writable / check_new_file).
FOLDER = "folder"
FILE = "file"  # a file the command replaces only as it says (export, convert check their own)
NEW_FILE = "new file"  # may name a user's file: written only when new, or with --force


def flag_number(whole: bool = False, **bounds: float) -> Callable[[str], Any]:
    """An argparse `type=`: a number through the one check of numbers (config.fields.number):
    finite, in digits, within `bounds`. Every int and float flag gets one (cli.build_parser)."""
    from vitlab.config.fields import ConfigError, number

    limits: dict[str, Any] = bounds  # (typed Any: spread among number()'s other keywords)

    def parse(text: str) -> Any:
        try:
            return number(text, "", whole=whole, **limits)
        except ConfigError as e:  # argparse names the flag: "argument --lr: 'inf' is not a finite number"
            raise argparse.ArgumentTypeError(str(e).lstrip("=").strip()) from None

    parse.__name__ = "whole number" if whole else "number"
    return parse


def at_least(least: int) -> Callable[[str], int]:
    """An argparse `type=`: a whole number no smaller than `least`. Counts and sizes are
    checked where they are parsed: a batch of 0 divides by zero deep inside, a batch of -1
    silently does nothing."""
    whole = flag_number(whole=True)

    def count(text: str) -> int:
        value = whole(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    return count


COUNT = at_least(1)
COUNT_OR_ZERO = at_least(0)


def add_checkpoint_arguments(p, random_init: bool = True, draws: bool = False) -> None:
    p.add_argument("checkpoint", help="a checkpoint in any format vitlab reads, or a pretrained name")
    p.add_argument("--format", help="the checkpoint's format, when detection cannot tell")
    if not random_init:
        return
    if draws:  # a control over K random draws: SEED or FIRST-LAST (analysis.inspection.random_draws)
        p.add_argument("--random-init", metavar="SEED[-LAST]",
                       help="ignore the weights: a randomly initialised model of the checkpoint's shape (a baseline); "
                            "FIRST-LAST (0-9): the mean over that many random draws, each draw recorded")
        return
    p.add_argument("--random-init", type=int, metavar="SEED",
                   help="ignore the weights: a randomly initialised model of the checkpoint's shape (a baseline)")


def precision_check(args) -> None:
    """The inference copy's precision (predict, serve), checked before the checkpoint is read."""
    from vitlab.predictor import check_precision

    check_precision(args.precision)


def add_device_argument(p) -> None:
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or mps (default auto: cuda when available)")


def add_plain_argument(p) -> None:
    p.add_argument("--plain", action="store_true", help="run the model as PyTorch does, not vitlab.deploy's CPU "
                   "inference copy (the default: each Dense shape and the attention on the kernel timed fastest on this "
                   "machine, oneDNN-packed with bias and GELU fused or F.linear; the same logits to 1e-4)")


def bad_image_message(e: Exception) -> str:
    """A BadImageError's own sentence, without the class path a data-loader worker prefixes
    ("vitlab.data.datasets.BadImageError: ...") when it re-raises the error in the parent."""
    import re

    line = str(e).strip().splitlines()[-1]
    return re.sub(r"^(\w+\.)*BadImageError: ", "", line)


def add_training_arguments(p, default_recipe: str) -> None:
    """The flags `train` and `finetune` share: the recipe, the data, the run's length and its settings."""
    p.add_argument("--config", default=default_recipe, metavar="RECIPE",
                   help=f"a recipe YAML file or a shipped recipe's name (default: {default_recipe})")
    from vitlab.config.run import DATA_SPECS

    p.add_argument("--data", metavar="SPEC", help=DATA_SPECS)
    p.add_argument("--image-size", type=COUNT, metavar="N", help="training resolution (model.image_size)")
    subset = p.add_mutually_exclusive_group()
    subset.add_argument("--train-fraction", type=float, metavar="F", help="train on a fixed, class-balanced share "
                        "F of the training split, the same in every run (data.train_fraction)")
    subset.add_argument("--train-size", type=COUNT, metavar="N", help="... or on N images of it (data.train_size)")
    p.add_argument("--batch-size", type=COUNT, metavar="N", help="global batch size (train.batch_size)")
    p.add_argument("--micro-batch-size", type=COUNT, metavar="N", help="per process and forward pass; the rest is "
                   "gradient accumulation")
    p.add_argument("--lr", type=float, help="peak learning rate (optim.lr)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=float, help="train for this many epochs")
    length.add_argument("--steps", type=COUNT, help="train for this many optimiser steps")
    p.add_argument("--warmup-steps", type=COUNT_OR_ZERO, help="linear warm-up steps (optim.warmup_steps)")
    p.add_argument("--seed", type=int, help="random seed (train.seed)")
    p.add_argument("--out", metavar="DIR", help="the run folder (default: runs/RECIPE)")
    p.add_argument("--ckpt-every", type=COUNT, metavar="STEPS", help="write a checkpoint every STEPS steps")
    p.add_argument("--eval-every", type=COUNT_OR_ZERO, metavar="STEPS", help="evaluate every STEPS steps (0: at the end)")
    p.add_argument("--workers", type=COUNT_OR_ZERO, metavar="N", help="data-loader worker processes (data.num_workers)")
    p.add_argument("--skip-bad-images", action="store_true", default=None,
                   help="skip and count unreadable images instead of stopping with the file's name")
    p.add_argument("--antialias", action=argparse.BooleanOptionalAction, default=None, help="filter before "
                   "shrinking images (data.antialias, default on); --no-antialias: as TF's resize does by default")
    _add_regularisation(p)
    _add_precision_and_output(p)


def _add_regularisation(p) -> None:
    reg = p.add_argument_group("regularisation (DeiT, and Steiner et al.'s \"How to train your ViT\")")
    reg.add_argument("--mixup", type=float, metavar="ALPHA", help="Mixup with Beta(ALPHA, ALPHA) (train.mixup; DeiT 0.8)")
    reg.add_argument("--cutmix", type=float, metavar="ALPHA", help="CutMix with Beta(ALPHA, ALPHA) (train.cutmix; DeiT "
                     "1.0); with --mixup, one of the two per batch")
    from vitlab.config.run import AUGMENTATIONS

    for a in AUGMENTATIONS:  # one flag each, from the table (config/run.py)
        keys = ", ".join(f"data.{k}" for k in a.keys)
        reg.add_argument(f"--{a.option.replace('_', '-')}", **{**a.flag, "help": f"{a.flag['help']} ({keys})"})
    reg.add_argument("--label-smoothing", type=float, metavar="EPS", help="label smoothing (train.label_smoothing; 0.1)")
    reg.add_argument("--drop-path", type=float, metavar="RATE", help="stochastic depth, largest rate at the last block "
                     "(model.drop_path; DeiT 0.1)")
    reg.add_argument("--ema", type=float, nargs="?", const=0.9999, metavar="DECAY",
                     help="Polyak averaging of the weights (default decay 0.9999, the paper's)")


def _add_precision_and_output(p) -> None:
    from vitlab.train.tracking import TRACKERS

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


# Flag -> the config key it sets (flags whose value is the key's value).
FLAG_KEYS = {
    "data": "data.name", "image_size": "model.image_size", "batch_size": "train.batch_size",
    "micro_batch_size": "train.micro_batch_size", "lr": "optim.lr", "warmup_steps": "optim.warmup_steps",
    "seed": "train.seed", "ckpt_every": "train.ckpt_every", "eval_every": "train.eval_every",
    "workers": "data.num_workers", "skip_bad_images": "data.skip_bad_images", "ema": "train.ema",
    "compile": "train.compile", "grad_checkpointing": "train.grad_checkpointing", "device": "train.device",
    "objective": "train.objective", "mixup": "train.mixup", "cutmix": "train.cutmix",
    "label_smoothing": "train.label_smoothing", "drop_path": "model.drop_path",
    "train_fraction": "data.train_fraction", "train_size": "data.train_size", "antialias": "data.antialias",
}


def given(args: argparse.Namespace):
    """The one place the command line becomes the library's settings (train.recipe.Given):
    every training flag given (not None) as the config keys it sets, in FLAG_KEYS' order, then
    those that set several keys or a key of their own value, then the SECTION.KEY=VALUE
    overrides; --model as the variant that replaces the recipe's."""
    from vitlab.config import parse_override
    from vitlab.config.run import AUGMENTATIONS
    from vitlab.train.recipe import Given

    o = vars(args)
    out = [(f"--{attr.replace('_', '-')}", key, o[attr]) for attr, key in FLAG_KEYS.items() if o.get(attr) is not None]
    if o.get("epochs") is not None:
        out += [("--epochs", "train.epochs", o["epochs"]), ("--epochs", "train.steps", 0)]
    if o.get("steps") is not None:
        out.append(("--steps", "train.steps", o["steps"]))
    for a in AUGMENTATIONS:  # --KEY VALUE, or --randaugment N M: one value per key of the augmentation
        if o.get(a.option) is not None:
            values = o[a.option] if len(a.keys) > 1 else [o[a.option]]
            out += [(f"--{a.option.replace('_', '-')}", f"data.{k}", v) for k, v in zip(a.keys, values, strict=True)]
    out += [(f"--{flag}", "train.precision", flag) for flag in ("bf16", "fp16") if o.get(flag)]
    out += [("--fsdp", "train.parallel", "fsdp")] if o.get("fsdp") else []
    return Given(tuple(out) + tuple((x, *parse_override(x)) for x in o.get("overrides") or ()), o.get("model"))


def command_line() -> str:
    """The command as typed, for the run folder's record."""
    import shlex

    return "vitlab " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def training_exit(train, command: str = "train") -> int:
    """Run `train()` and turn how a training ends into the exit status: 0 done, 3 stopped by a
    diverging loss, 2 an unreadable image (named); the checkpoints written so far are kept.
    (A run stopped by a signal ends every command the same way: vitlab.cli.main, status 75.)"""
    from vitlab.data import BadImageError
    from vitlab.train.loop import TrainingDiverged

    try:
        train()
    except TrainingDiverged as e:
        print(f"vitlab {command}: stopped: {e}", file=sys.stderr)
        return 3
    except BadImageError as e:
        print(f"vitlab {command}: error: {bad_image_message(e)}", file=sys.stderr)
        return 2
    return 0


def add_feature_arguments(p, train_help: str, test_help: str, draws: bool = False) -> None:
    """What the commands that read frozen features share: the checkpoint, the data, its splits,
    the batch, the device, the feature cache and the output (`draws`: --random-init takes a range)."""
    add_checkpoint_arguments(p, draws=draws)
    add_device_argument(p)
    add_plain_argument(p)
    from vitlab.config.run import DATA_SPECS

    p.add_argument("--data", required=True, metavar="SPEC", help=DATA_SPECS)
    p.add_argument("--train-split", default="train", help=f"{train_help} (default train)")
    p.add_argument("--test-split", default="test", help=f"{test_help} (default test)")
    p.add_argument("--test-limit", type=COUNT_OR_ZERO, default=0, help="use at most this many test images (default 0: all)")
    p.add_argument("--batch-size", type=COUNT, default=128)
    p.add_argument("--workers", type=COUNT_OR_ZERO, default=0, help="data-loader processes decoding images (default 0)")
    p.add_argument("--no-cache", action="store_true", help="recompute features, do not read or write the cache")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--out", help="also write the JSON result to this file (a new one, or --force)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")


def print_result(args, result: dict, title: str, print_table: Callable[[Any, dict], None]) -> None:
    """Write the result to --out when asked; print it as JSON with --json, else as the
    command's table (`title`, the model and the data, then `print_table(args, result)`)
    followed by where --out went."""
    if args.out:
        from vitlab.files import atomic_write_text  # an old file is replaced only by a complete new one

        atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return
    what = "random init" if args.random_init is not None else args.checkpoint
    print(f"{title}  {result['model']} ({what})  on {args.data}")
    print_table(args, result)
    if args.out:
        print(f"wrote {args.out}")


def feature_model(args):
    """(model, its fingerprint): the checkpoint on --device as deploy's inference copy (unless --plain)."""
    from vitlab.checkpoints import open_checkpoint
    from vitlab.config import pick_device
    from vitlab.deploy import inference_copy
    from vitlab.eval.features import model_fingerprint

    model, _ = open_checkpoint(args.checkpoint, args.format, args.random_init, pick_device(args.device))
    print(f"extracting features of {model.config.name} on {args.data}", file=sys.stderr)
    return inference_copy(model, plain=args.plain), model_fingerprint(model)


def frozen_features(args, model, split: str, max_per_class, limit, model_hash: str):
    """((features, labels), class names) of one split, cached, with a progress bar: the
    library's dataset_features, for fewshot and linear-probe (with --preprocess: fewshot's)."""
    from vitlab.eval.features import dataset_features
    from vitlab.eval.fewshot import fewshot_config
    from vitlab.progress import Progress

    features, labels, names = dataset_features(
        model, args.data, split, max_per_class=max_per_class or None, limit=limit or None, batch_size=args.batch_size,
        use_cache=not args.no_cache, model_hash=model_hash, log=lambda m: print(f"  {split}: {m}", file=sys.stderr),
        progress=Progress, workers=args.workers,
        preprocessing=fewshot_config(model.config, getattr(args, "preprocess", "model")))
    return (features, labels), names


def lr_rates(text: str | None) -> tuple[float, ...] | None:
    """--lr-grid's rates (an empty list for an empty one, which the library refuses), or None for Table 4's."""
    from vitlab.cli import UsageError

    if text is None:
        return None
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"--lr-grid {text!r}: give rates separated by commas, e.g. 0.001,0.003,0.01") from None


def launcher_params(items: list[str]) -> dict:
    """--slurm KEY=VALUE items as a submitit executor's parameters (values read as YAML)."""
    import yaml

    from vitlab.cli import UsageError

    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--slurm {item!r}: write KEY=VALUE, e.g. --slurm timeout_min=60")
        params[key.strip()] = yaml.safe_load(value)
    return params
