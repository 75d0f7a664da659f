"""Helpers the evaluation commands share (predict, fewshot, linear-probe, inspect): opening a
checkpoint with its metadata, opening data with its preprocessing, finding and reading image
files, writing JSON atomically."""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Optional

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}


def add_checkpoint_arguments(p, random_init: bool = True) -> None:
    p.add_argument("checkpoint", help="a checkpoint in any format vitlab reads, or a pretrained name")
    p.add_argument("--format", help="the checkpoint's format, when detection cannot tell")
    if not random_init:
        return
    p.add_argument(
        "--random-init",
        type=int,
        metavar="SEED",
        help="ignore the weights: a randomly initialised model of the checkpoint's shape (a baseline)",
    )


def add_device_argument(p) -> None:
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or mps (default auto: cuda when available)")


def bad_image_message(e: Exception) -> str:
    """A BadImageError's own sentence, without the class path a data-loader worker prefixes
    ("vitlab.data.datasets.BadImageError: ...") when it re-raises the error in the parent."""
    import re

    line = str(e).strip().splitlines()[-1]
    return re.sub(r"^(\w+\.)*BadImageError: ", "", line)


def progress(iterable=None, total=None, desc: str = "", unit: str = "img"):
    """A tqdm bar on stderr when it is a terminal; nothing in a log file."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True, disable=None)


def add_feature_arguments(p, train_help: str, test_help: str) -> None:
    """What the commands that read frozen features share: the checkpoint, the data, its splits,
    the batch, the device, the feature cache and the output."""
    add_checkpoint_arguments(p)
    add_device_argument(p)
    p.add_argument("--data", required=True,
                   help="data spec: digits, fashion-mnist[:DIR], cifar10[:DIR], imagefolder:PATH, wds:PATTERN, hf:NAME")
    p.add_argument("--train-split", default="train", help=f"{train_help} (default train)")
    p.add_argument("--test-split", default="test", help=f"{test_help} (default test)")
    p.add_argument("--test-limit", type=int, default=0, help="use at most this many test images (default 0: all)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--no-cache", action="store_true", help="recompute features, do not read or write the cache")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--out", help="also write the JSON result to this file (a new one, or --force)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")


def open_checkpoint(path: str, format: Optional[str] = None, random_init: Optional[int] = None, device=None,
                    **overrides):
    """(model in eval mode, Imported) for a checkpoint path or pretrained name; `overrides`
    change the config as vitlab.load's do (image_size=384 resizes the position embeddings)."""
    from vitlab import checkpoints

    imported = checkpoints.read_checkpoint(path, format)  # a path, or a name fetched from the Hub
    if random_init is not None:
        import torch

        from vitlab.models import build

        torch.manual_seed(random_init)
        model = build(imported.config.replace(**overrides) if overrides else imported.config)
        model.class_names = imported.class_names
    else:
        model = checkpoints.build_model(imported, path, **overrides)
    return (model.to(device) if device is not None else model).eval(), imported


def open_data(spec: str, split: str, config, class_names: Optional[list[str]] = None):
    """A dataset of (normalised tensor, label) with the checkpoint's preprocessing.

    WebDataset shards carry class indices only; without a classes.txt beside them the
    checkpoint's class names (when it has one per class) name them.
    """
    from vitlab.data import open_dataset

    options = {}
    if spec.lower().startswith("wds:") and class_names and len(class_names) == config.num_classes:
        shards = Path(spec[4:]).expanduser()
        if not (shards.is_dir() and (shards / "classes.txt").is_file()):
            options["classes"] = list(class_names)
    return open_dataset(
        spec,
        split,
        image_size=config.image_size,
        in_channels=config.in_channels,
        mean=config.mean,
        std=config.std,
        train=False,
        crop_fraction=config.crop_fraction,
        crop_mode=config.crop_mode,
        interpolation=config.interpolation,
        **options,
    )


def data_key(spec: str, split: str, config) -> dict:
    """What, besides the weights, decides the features: the data and the preprocessing."""
    return {
        "data": spec,
        "split": split,
        "image_size": list(config.image_size),
        "in_channels": config.in_channels,
        "mean": list(config.mean),
        "std": list(config.std),
        "crop": [config.crop_fraction, config.crop_mode, config.interpolation],
    }


def write_json(path: str, payload: dict) -> None:
    """Write JSON atomically: an old file is replaced only by a complete new one."""
    from vitlab.files import atomic_write_text

    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")


def print_result(args, result: dict) -> bool:
    """Write the result to --out when asked; print it as JSON and return True with --json."""
    if args.out:
        write_json(args.out, result)
    if args.json:
        print(json.dumps(result, indent=2))
    return bool(args.json)


def find_images(args: list[str]) -> list[Path]:
    """Files as given, folders searched recursively for image suffixes, globs expanded."""
    from vitlab.cli import UsageError

    found: list[Path] = []
    for a in args:
        p = Path(a)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise UsageError(f"{a}: the folder holds no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
            found.extend(files)
        elif p.exists():
            found.append(p)
        elif glob.has_magic(a):
            files = sorted(Path(f) for f in glob.glob(a, recursive=True) if Path(f).is_file())
            if not files:
                raise UsageError(f"{a}: the pattern matches no files")
            found.extend(files)
        else:
            raise FileNotFoundError(f"{a}: no such file or folder")
    return found


def image_loader(config):
    """path -> normalised (C, H, W) tensor with the checkpoint's preprocessing."""
    from vitlab.data import read_image
    from vitlab.data.transforms import model_transform

    transform = model_transform(config)  # the checkpoint's resize, crop and normalisation
    return lambda path: transform(read_image(path))


def read_images(paths: list[Path], config) -> tuple[list[tuple[Path, object]], list[tuple[Path, str]]]:
    """([(path, tensor)], [(path, why it failed)]) — a bad file never stops the others."""
    load = image_loader(config)
    ok, failed = [], []
    for p in paths:
        try:
            ok.append((p, load(p)))
        except Exception as e:  # PIL raises many types for a file that is not an image
            failed.append((p, unreadable(e, p)))
    return ok, failed


def unreadable(e: Exception, path: Path) -> str:
    """Why `path` could not be read as an image, in a few words (the file is named by the caller)."""
    text = str(e)
    if text.startswith(f"{path}: "):  # read_image names the file; we print it once
        text = text[len(f"{path}: ") :]
    text = text.split("; fix or remove")[0]  # its advice is for datasets, not for these files
    if "cannot identify image" in text:
        return "not an image file vitlab can read (PIL cannot identify it)"
    return text if "cannot read" in text else f"cannot read it as an image ({type(e).__name__}: {text})"
