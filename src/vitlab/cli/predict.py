"""`vitlab predict CHECKPOINT IMAGE...`: top-k classes for image files, folders and globs."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

from vitlab.cli.common import add_checkpoint_arguments, add_device_argument, find_images, open_checkpoint, read_images

from vitlab.config import pick_device
from vitlab.files import OutputFolder, to_name

HELP = "classify images with a checkpoint: top-k classes, probabilities, rollout overlays"
DESCRIPTION = """\
Classify image files with any checkpoint vitlab can read. Preprocessing comes from the
checkpoint's config (image size, channels, mean/std); images of any mode and size are
converted (greyscale, RGBA over white, palette, 16-bit scaled). Arguments may be files,
folders (searched recursively for image files) or glob patterns. Images are decoded and
classified --batch-size at a time and each line is printed as soon as its batch is done,
so a large folder starts answering at once. A file that cannot be read as an image is
reported and skipped; the others still run, and the exit status is 1 if any failed.

`--csv FILE` writes one row per image (the top-k classes and probabilities, the overlay,
the error for a file that could not be read). `--attention DIR` also writes, per image,
the attention rollout (Fig. 6) as a heat map over the image, headed by the predicted class.

examples:
  vitlab predict runs/digits/checkpoints/last.safetensors digit.png
  vitlab predict model.safetensors photos/ --top-k 3 --csv predictions.csv
  vitlab predict model.safetensors 'shots/*.png' --attention overlays/ --device cuda
"""


def add_arguments(p) -> None:
    add_checkpoint_arguments(p, random_init=False)
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files, folders or glob patterns")
    p.add_argument("--top-k", type=int, default=5, help="classes to show per image (default 5)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table (at the end)")
    p.add_argument("--csv", metavar="FILE", help="also write one CSV row per image to FILE")
    p.add_argument("--attention", metavar="DIR", help="write an attention-rollout overlay PNG per image here")
    p.add_argument("--force", action="store_true", help="replace --csv and overlays that exist and are not predict's")
    p.add_argument("--batch-size", type=int, default=16, help="images decoded and classified at a time (default 16)")
    add_device_argument(p)


def run(args) -> int:
    import torch

    from vitlab.cli import UsageError
    from vitlab.cli.common import progress

    for name in ("top_k", "batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    device = pick_device(args.device)
    model, _ = open_checkpoint(args.checkpoint, args.format, device=device)
    cfg = model.config
    if not cfg.num_classes:
        raise UsageError(
            f"{args.checkpoint}: the checkpoint has no classification head (num_classes=0); fine-tune it "
            "(`vitlab finetune`) or evaluate its features with `vitlab linear-probe`"
        )
    if args.attention and not cfg.has_attention:
        raise UsageError(f"--attention: {cfg.name} is a BiT ResNet and has no attention to draw; drop --attention")
    names = model.class_names or [f"class {i}" for i in range(cfg.num_classes)]
    paths = find_images(args.images)
    k = min(args.top_k, cfg.num_classes)
    width = max(len(str(p)) for p in paths)
    overlays = None
    if args.attention:  # the user may keep files there: only new ones, or predict's own, are written
        overlays = OutputFolder(args.attention, "predict", args.force)
        overlays.claim(overlay_name(i, p) for i, p in enumerate(paths))
    results, failed = [], []
    with progress(total=len(paths), desc="predict") as bar, torch.no_grad():
        for start in range(0, len(paths), args.batch_size):
            chunk, bad = read_images(paths[start : start + args.batch_size], cfg)
            for p, why in bad:
                bar.write(f"vitlab predict: {p}: {why}; skipped", file=sys.stderr)
            failed += bad
            if chunk:
                rows = _classify(model, chunk, names, k, device, overlays, start)
                results += rows
                if not args.json:
                    for r in rows:
                        bar.write(_line(r, width), file=sys.stdout)
            bar.update(len(chunk) + len(bad))
    if overlays is not None:
        overlays.record()
    if args.csv:
        _write_csv(args.csv, paths, results, failed, k)
    if args.json:
        print(json.dumps({"results": results, "errors": [{"image": str(p), "error": w} for p, w in failed]}, indent=2))
    elif failed:
        print(f"{len(failed)} of {len(paths)} file(s) could not be read (see above)", file=sys.stderr)
    if args.csv and not args.json:
        print(f"wrote {args.csv} ({len(results) + len(failed)} rows)", file=sys.stderr)
    return 1 if failed else 0


def _classify(model, chunk, names: list[str], k: int, device, attention: "OutputFolder | None", offset: int) -> list[dict]:
    import torch

    x = torch.stack([t for _, t in chunk]).to(device)
    out = model(x, return_intermediates=True) if attention else None
    logits = out["logits"] if out is not None else model(x)
    top_p, top_i = logits.float().softmax(-1).topk(k, dim=-1)
    rows = []
    for (p, _), ps, ix in zip(chunk, top_p.tolist(), top_i.tolist()):
        rows.append({"image": str(p), "predictions": [{"class": names[i], "index": i, "probability": pr}
                                                      for pr, i in zip(ps, ix)]})
    if out is not None:
        for row, png in zip(rows, _write_overlays(model, x, out, rows, attention, offset)):
            row["attention"] = str(png)
    return rows


def _line(r: dict, width: int) -> str:
    top, rest = r["predictions"][0], r["predictions"][1:]
    others = "  ".join(f"{q['class']} {100 * q['probability']:.1f}%" for q in rest)
    line = f"{r['image']:<{width}}  {top['class']} {100 * top['probability']:.1f}%"
    return line + (f"   ({others})" if others else "") + (f"   -> {r['attention']}" if "attention" in r else "")


def _write_csv(path: str, paths: list[Path], results: list[dict], failed: list, k: int) -> None:
    """One row per image, in the order given: the top-k classes with probabilities, the
    overlay, and the error of a file that could not be read."""
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


def overlay_name(index: int, image: Path) -> str:
    """The overlay PNG of the index-th image: its name made safe and short (files.to_name)."""
    return to_name(f"{index:04d}_{Path(image).stem}_rollout", 100) + ".png"


def _write_overlays(model, x, out, rows: list[dict], folder: "OutputFolder", offset: int) -> list[Path]:
    from vitlab.analysis import attention_rollout, display_images, upsample_map
    from vitlab.analysis.plots import plot_overlay

    maps = attention_rollout(out["attentions"], out["grid"], model.num_prefix_tokens)
    maps = upsample_map(maps, tuple(x.shape[2:]))
    images = display_images(x, model.config.mean, model.config.std)
    written = []
    for i, row in enumerate(rows):
        top = row["predictions"][0]
        target = folder.path(overlay_name(offset + i, row["image"]))
        written.append(plot_overlay(images[i], maps[i], target, title=Path(row["image"]).name,
                                    prediction=f"{top['class']} ({100 * top['probability']:.1f}%)"))
    return written
