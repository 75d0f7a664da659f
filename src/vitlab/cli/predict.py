"""`vitlab predict CHECKPOINT IMAGE...`: top-k classes for image files, folders and globs.

Also home of the helpers the other evaluation commands share (opening a checkpoint with its
metadata, finding image files, reading them with the checkpoint's preprocessing).
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path
from typing import Optional

HELP = "classify images with a checkpoint: top-k classes, probabilities, rollout overlays"
DESCRIPTION = """\
Classify image files with any checkpoint vitlab can read. Preprocessing comes from the
checkpoint's config (image size, channels, mean/std); images of any mode and size are
converted (greyscale, RGBA over white, palette, 16-bit scaled). Arguments may be files,
folders (searched recursively for image files) or glob patterns. A file that cannot be
read as an image is reported and skipped; the others still run, and the exit status is 1
if any failed.

`--attention DIR` also writes, per image, the attention rollout (Fig. 6) over the image.

examples:
  vitlab predict runs/cifar10/checkpoints/last.safetensors cat.png dog.jpg
  vitlab predict model.safetensors photos/ --top-k 3 --json
  vitlab predict model.safetensors 'shots/*.png' --attention overlays/
"""

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}


def add_arguments(p) -> None:
    p.add_argument("checkpoint", help="a checkpoint in any format vitlab reads, or a pretrained name")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files, folders or glob patterns")
    p.add_argument("--top-k", type=int, default=5, help="classes to show per image (default 5)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--attention", metavar="DIR", help="write an attention-rollout overlay PNG per image here")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--format", help="the checkpoint's format, when detection cannot tell")


# Shared by fewshot, linear-probe, inspect -------------------------------------------------
def add_checkpoint_arguments(p) -> None:
    p.add_argument("checkpoint", help="a checkpoint in any format vitlab reads, or a pretrained name")
    p.add_argument("--format", help="the checkpoint's format, when detection cannot tell")
    p.add_argument(
        "--random-init",
        type=int,
        metavar="SEED",
        help="ignore the weights: a randomly initialised model of the checkpoint's shape (a baseline)",
    )


def open_checkpoint(path: str, format: Optional[str] = None, random_init: Optional[int] = None):
    """(model in eval mode, Imported) for a checkpoint path or pretrained name."""
    from vitlab import checkpoints

    if not Path(path).exists() and ":" in path:
        from vitlab.checkpoints import pretrained

        path = str(pretrained.fetch(path))
    imported = checkpoints.read_checkpoint(path, format)
    if random_init is not None:
        import torch

        from vitlab.models.vit import VisionTransformer

        torch.manual_seed(random_init)
        model = VisionTransformer(imported.config)
        model.class_names = imported.class_names
        return model.eval(), imported
    return checkpoints.build_model(imported, path), imported


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
    }


def write_json(path: str, payload: dict) -> None:
    """Write JSON atomically: an old file is replaced only by a complete new one."""
    import os

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, target)


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
    from vitlab.data.transforms import eval_transform

    transform = eval_transform(config.image_size, config.mean, config.std, config.in_channels)
    return lambda path: transform(read_image(path))


def read_images(paths: list[Path], config) -> tuple[list[tuple[Path, object]], list[tuple[Path, str]]]:
    """([(path, tensor)], [(path, why it failed)]) — a bad file never stops the others."""
    load = image_loader(config)
    ok, failed = [], []
    for p in paths:
        try:
            ok.append((p, load(p)))
        except Exception as e:  # PIL raises many types for a file that is not an image
            failed.append((p, _why(e, p)))
    return ok, failed


def _why(e: Exception, path: Path) -> str:
    text = str(e)
    if text.startswith(f"{path}: "):  # read_image names the file; we print it once
        text = text[len(f"{path}: ") :]
    text = text.split("; fix or remove")[0]  # its advice is for datasets, not for these files
    if "cannot identify image" in text:
        return "not an image file vitlab can read (PIL cannot identify it)"
    return text if "cannot read" in text else f"cannot read it as an image ({type(e).__name__}: {text})"


# predict --------------------------------------------------------------------------------
def run(args) -> int:
    import torch

    from vitlab.cli import UsageError

    if args.top_k < 1:
        raise UsageError(f"--top-k must be at least 1, got {args.top_k}")
    model, _ = open_checkpoint(args.checkpoint, args.format)
    cfg = model.config
    if not cfg.num_classes:
        raise UsageError(
            f"{args.checkpoint}: the checkpoint has no classification head (num_classes=0); fine-tune it "
            "(`vitlab finetune`) or evaluate its features with `vitlab linear-probe`"
        )
    names = model.class_names or [f"class {i}" for i in range(cfg.num_classes)]
    paths = find_images(args.images)
    loaded, failed = read_images(paths, cfg)
    for p, why in failed:
        print(f"vitlab predict: {p}: {why}; skipped", file=sys.stderr)

    results = []
    k = min(args.top_k, cfg.num_classes)
    attention_dir = Path(args.attention) if args.attention else None
    with torch.no_grad():
        for start in range(0, len(loaded), args.batch_size):
            chunk = loaded[start : start + args.batch_size]
            x = torch.stack([t for _, t in chunk])
            if attention_dir is not None:
                out = model(x, return_intermediates=True)
                logits = out["logits"]
                overlays = _write_overlays(model, x, out, [p for p, _ in chunk], attention_dir, len(results))
            else:
                logits, overlays = model(x), [None] * len(chunk)
            probs = logits.float().softmax(-1)
            top_p, top_i = probs.topk(k, dim=-1)
            for (p, _), ps, ix, ov in zip(chunk, top_p.tolist(), top_i.tolist(), overlays):
                entry = {
                    "image": str(p),
                    "predictions": [{"class": names[i], "index": i, "probability": pr} for pr, i in zip(ps, ix)],
                }
                if ov:
                    entry["attention"] = str(ov)
                results.append(entry)

    if args.json:
        print(json.dumps({"results": results, "errors": [{"image": str(p), "error": w} for p, w in failed]}, indent=2))
    else:
        width = max((len(r["image"]) for r in results), default=5)
        for r in results:
            preds = r["predictions"]
            top = preds[0]
            rest = "  ".join(f"{q['class']} {100 * q['probability']:.1f}%" for q in preds[1:])
            line = f"{r['image']:<{width}}  {top['class']} {100 * top['probability']:.1f}%"
            print(line + (f"   ({rest})" if rest else "") + (f"   -> {r['attention']}" if "attention" in r else ""))
        if failed:
            print(f"{len(failed)} of {len(paths)} file(s) could not be read (see above)", file=sys.stderr)
    return 1 if failed else 0


def _write_overlays(model, x, out, paths, folder: Path, offset: int) -> list[Path]:
    from vitlab.analysis import attention_rollout, display_images, upsample_map
    from vitlab.analysis.plots import plot_overlay

    maps = attention_rollout(out["attentions"], out["grid"], model.num_prefix_tokens)
    maps = upsample_map(maps, tuple(x.shape[2:]))
    images = display_images(x, model.config.mean, model.config.std)
    written = []
    for i, p in enumerate(paths):
        target = folder / f"{offset + i:04d}_{Path(p).stem}_rollout.png"
        written.append(plot_overlay(images[i], maps[i], target, title=Path(p).name))
    return written
