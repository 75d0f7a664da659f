"""Classify image files with any checkpoint vitlab can read. Preprocessing comes from the
checkpoint's config (image size, channels, mean/std); images of any mode and size are
converted (greyscale, RGBA over white, palette, 16-bit scaled). Arguments may be files,
folders (searched recursively for image files) or glob patterns. Images are decoded and
classified --batch-size at a time and each line is printed as soon as its batch is done,
so a large folder starts answering at once. A file that cannot be read as an image is
reported and skipped; the others still run, and the exit status is 1 if any failed.

`--csv FILE` writes one row per image (the top-k classes and probabilities, the overlay,
the error for a file that could not be read). `--attention DIR` also writes, per image,
the attention rollout (Fig. 6) as a heat map over the image, captioned with the predicted
class: the overlay `vitlab serve` returns, drawn by the same code. The work is
vitlab.Predictor's, as in `vitlab serve` and Python (`--precision` picks the same inference
copies as serve's). No image at hand? The first example writes a digit of the set
`vitlab train` trains on as digit.png.

examples:
  python -c "import numpy, importlib.resources as r; from PIL import Image; Image.fromarray(numpy.load(r.files('vitlab.data') / 'digits.npz')['images'][-1]).resize((64, 64)).save('digit.png')"
  vitlab predict runs/digits/checkpoints/last.safetensors digit.png
  vitlab predict model.safetensors photos/ --top-k 3 --csv predictions.csv
  vitlab predict model.safetensors 'shots/*.png' --attention overlays/ --device cuda
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

from vitlab.cli.common import COUNT, FOLDER, NEW_FILE, add_checkpoint_arguments, add_device_argument, add_plain_argument, precision_check
from vitlab.config import pick_device
from vitlab.files import OutputFolder

WRITES = {"attention": FOLDER, "csv": NEW_FILE}  # checked writable before any work (vitlab.cli.check_arguments)
HELP = "classify images with a checkpoint: top-k classes, probabilities, rollout overlays"


def add_arguments(p) -> None:
    add_checkpoint_arguments(p, random_init=False)
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files, folders or glob patterns")
    p.add_argument("--top-k", type=COUNT, default=5, help="classes to show per image (default 5)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table (at the end)")
    p.add_argument("--csv", metavar="FILE", help="also write one CSV row per image to FILE")
    p.add_argument("--attention", metavar="DIR", help="write an attention-rollout overlay PNG per image here")
    p.add_argument("--force", action="store_true", help="replace --csv and overlays that exist and are not predict's")
    p.add_argument("--batch-size", type=COUNT, default=16, help="images decoded and classified at a time (default 16)")
    p.add_argument("--precision", default="fp32", help="fp32 (default), bf16, fp16, int8 or fp32-packed (as serve)")
    add_device_argument(p)
    add_plain_argument(p)


check = precision_check  # the dispatcher's check before any work


def run(args) -> int:
    from vitlab.checkpoints import open_checkpoint
    from vitlab.cli import UsageError
    from vitlab.data.image_files import find_images, unreadable
    from vitlab.predictor import Predictor, overlay_name
    from vitlab.progress import Progress

    model, _ = open_checkpoint(args.checkpoint, args.format)
    predictor = Predictor(model, args.precision, pick_device(args.device), checkpoint=args.checkpoint, plain=args.plain)
    if args.attention and not predictor.has_attention:
        raise UsageError(f"--attention: {predictor.config.name} is a BiT ResNet and has no attention to draw; drop --attention")
    paths = find_images(args.images)
    width = max(len(str(p)) for p in paths)
    overlays = OutputFolder(args.attention, "predict", args.force) if args.attention else None
    if overlays is not None:  # the user may keep files there: only new ones, or predict's own, are written
        overlays.claim(overlay_name(i, Path(p).stem) for i, p in enumerate(paths))  # and each again as it is written
    results, failed = [], []
    with Progress(total=len(paths), desc="predict") as bar:
        def skipped(path, error) -> None:
            failed.append((path, unreadable(error, path)))
            bar.write(f"vitlab predict: {path}: {failed[-1][1]}; skipped", file=sys.stderr)
            bar.update(1)

        for row in predictor.predict(paths, args.top_k, args.batch_size, overlays=overlays, on_error=skipped):
            results.append({k: v for k, v in row.items() if k in ("image", "predictions", "attention")})
            if not args.json:
                bar.write(_line(results[-1], width), file=sys.stdout)
            bar.update(1)
    if overlays is not None:
        overlays.record()
    return _finish(args, paths, results, failed, min(args.top_k, predictor.config.num_classes))


def _finish(args, paths, results: list[dict], failed: list, k: int) -> int:
    if args.csv:
        _write_csv(args.csv, paths, results, failed, k)
    if args.json:
        print(json.dumps({"results": results, "errors": [{"image": str(p), "error": w} for p, w in failed]}, indent=2))
    elif failed:
        print(f"{len(failed)} of {len(paths)} file(s) could not be read (see above)", file=sys.stderr)
    if args.csv and not args.json:
        print(f"wrote {args.csv} ({len(results) + len(failed)} rows)", file=sys.stderr)
    return 1 if failed else 0


def _line(r: dict, width: int) -> str:
    top, rest = r["predictions"][0], r["predictions"][1:]
    others = "  ".join(f"{q['class']} {100 * q['probability']:.1f}%" for q in rest)
    line = f"{r['image']:<{width}}  {top['class']} {100 * top['probability']:.1f}%"
    return line + (f"   ({others})" if others else "") + (f"   -> {r['attention']}" if "attention" in r else "")


def _write_csv(path: str, paths: list[Path], results: list[dict], failed: list, k: int) -> None:
    """One row per image, in the order given: top-k classes and probabilities, overlay, error."""
    from vitlab.files import atomic_write_text

    columns = ["image"] + [f"{what}_{i}" for i in range(1, k + 1) for what in ("class", "probability")]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns + ["attention", "error"])
    writer.writeheader()
    rows = {r["image"]: r for r in results}
    errors = {str(p): why for p, why in failed}
    for image in map(str, paths):
        row = {"image": image, "error": errors.get(image, ""), "attention": rows.get(image, {}).get("attention", "")}
        for i, q in enumerate(rows[image]["predictions"] if image in rows else [], start=1):
            row[f"class_{i}"], row[f"probability_{i}"] = q["class"], f"{q['probability']:.6f}"
        writer.writerow(row)
    atomic_write_text(path, buffer.getvalue())
