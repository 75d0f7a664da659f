"""`vitlab predict CHECKPOINT IMAGE...`: top-k classes for image files, folders and globs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vitlab.cli.common import find_images, open_checkpoint, read_images

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

def add_arguments(p) -> None:
    p.add_argument("checkpoint", help="a checkpoint in any format vitlab reads, or a pretrained name")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files, folders or glob patterns")
    p.add_argument("--top-k", type=int, default=5, help="classes to show per image (default 5)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--attention", metavar="DIR", help="write an attention-rollout overlay PNG per image here")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--format", help="the checkpoint's format, when detection cannot tell")


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
