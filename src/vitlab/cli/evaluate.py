"""Classify a dataset split with any checkpoint vitlab.load reads and report top-1 and top-5
accuracy, the loss, precision, recall and F1 (macro and per class), the calibration (expected
calibration error over 15 confidence bins), the accuracy of each class, the confusion matrix
and a reliability diagram (PNGs when matplotlib is installed). Images are preprocessed as the model's config says (its
resolution, channels, crop, resize and normalisation: what vitlab.transform(model) does), and
the results are labelled with the checkpoint's class names (a dataset whose classes are only
numbers, such as WebDataset shards without a classes.txt, takes them; names that disagree are
a warning, the same names in another order an error). Results go to OUT/eval-SPLIT.json and
OUT/confusion-SPLIT.png: --out OUT, or RUN/eval for a checkpoint inside a run folder
(RUN/checkpoints/); otherwise they are printed and not written. --predictions FILE.csv also
writes each image's probabilities of every class (one row per image, in the data's order).

--format and --random-init SEED work as in the other evaluation commands (the checkpoint's
shape with fresh weights is the baseline); --json prints everything, the confusion matrix
(counts[true][predicted]) and the class names included.

examples:
  vitlab eval runs/digits/checkpoints/last.safetensors --data digits
  vitlab eval runs/cifar10/checkpoints/last.safetensors --data wds:../shared/data/cifar10 --json
  vitlab eval runs/digits/checkpoints/last.safetensors --data digits --random-init 0 --out eval-random
  vitlab eval model.safetensors --data imagefolder:~/pets --split val --out results/pets --device cuda
  vitlab eval ViT-B_16.npz --data imagenet-val:~/imagenet/val --real ~/imagenet/real.json --image-size 384

--real LABELS.json adds ImageNet ReaL accuracy beside top-1: the reassessed labels of Beyer
et al. 2020 as published (one list of class ids per validation image, in file-name order;
an empty list leaves the image out), with --data imagenet-val:DIR.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitlab.cli.common import COUNT, COUNT_OR_ZERO, FOLDER, NEW_FILE

NAME = "eval"  # the command as typed (the module is named for what it does)
WRITES = {"out": FOLDER, "predictions": NEW_FILE}  # checked writable before any work (vitlab.cli.check_arguments)
READS_DATA = True  # data specs from files may name a pipe: command (--allow-pipe)
HELP = "evaluate a checkpoint: top-1/top-5, precision/recall/F1, calibration (ECE), confusion matrix"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from vitlab.cli.common import add_checkpoint_arguments, add_device_argument, add_plain_argument

    add_checkpoint_arguments(p)
    add_plain_argument(p)
    p.add_argument("--data", required=True, metavar="SPEC", help="dataset spec, as for vitlab train")
    p.add_argument("--split", default="test", help="test (default), val, train, dev")
    p.add_argument("--image-size", type=COUNT, metavar="N", help="evaluate at this resolution (position embeddings resized)")
    p.add_argument("--batch-size", type=COUNT, default=256)
    p.add_argument("--workers", type=COUNT_OR_ZERO, default=0, help="data-loader worker processes")
    p.add_argument("--skip-bad-images", action="store_true", help="skip and count unreadable images")
    add_device_argument(p)
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    p.add_argument("--out", metavar="DIR", help="where the JSON and the confusion matrix go")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--predictions", metavar="FILE.csv", help="also write each image's probabilities of every class")
    p.add_argument("--force", action="store_true", help="replace files in --out of eval's names that eval did not write")
    p.add_argument("--real", metavar="LABELS.json", help="ImageNet ReaL labels (real.json): ReaL accuracy beside top-1")


def run(args: argparse.Namespace) -> int:
    import torch

    from vitlab.checkpoints import open_checkpoint
    from vitlab.cli import UsageError
    from vitlab.cli.common import bad_image_message
    from vitlab.config import pick_device
    from vitlab.config.model import grid_note, grid_record
    from vitlab.data import BadImageError
    from vitlab.deploy import inference_copy
    from vitlab.eval.accuracy import evaluate_dataset, report, to_json, write_predictions
    from vitlab.eval.real import real_line
    from vitlab.progress import Progress

    device = pick_device(args.device)
    checkpoint, _ = open_checkpoint(args.checkpoint, args.format, args.random_init, device,
                                    **({"image_size": args.image_size} if args.image_size else {}))
    model = inference_copy(checkpoint, plain=args.plain or bool(args.bf16))  # bf16 autocast runs the plain model
    owner = _owner(args)  # a user's eval-SPLIT.json there: refused now, not replaced
    try:
        metrics, names = evaluate_dataset(
            model, args.data, args.split, batch_size=args.batch_size, workers=args.workers,
            skip_bad_images=args.skip_bad_images, device=device, autocast_dtype=torch.bfloat16 if args.bf16 else None,
            progress=Progress, real=args.real, probabilities=bool(args.predictions))
    except BadImageError as e:
        raise UsageError(bad_image_message(e)) from None
    if args.predictions:
        write_predictions(args.predictions, metrics.pop("images"), metrics.pop("probabilities"), names)
    metrics.update(grid_record(model.config))  # the patch grid, and the pixels past it no patch reads
    text = to_json(metrics, names)
    written = _write(owner, args.split, text, metrics, names, f"{checkpoint.config.name} on {args.data}, {args.split}")
    if args.json:
        print(text)
        return 0
    skipped = metrics["bad_images_skipped"]
    lines = (report(metrics, names), grid_note(model.config), real_line(metrics) if args.real else "",
             f"skipped {skipped} unreadable images" if skipped else "", "\n" + "\n".join(written))
    print("\n".join(line for line in lines if line))
    return 0


def _owner(args: argparse.Namespace):
    """The results folder (--out, else RUN/eval for a checkpoint in a run folder), its files
    claimed (files.OutputFolder: a user's eval-SPLIT.json there is refused unless --force);
    None when nothing is to be written."""
    from vitlab.files import OutputFolder
    from vitlab.run_layout import results_folder

    out = Path(args.out) if args.out else results_folder(args.checkpoint)
    if out is None:
        return None
    owner = OutputFolder(out, "eval", args.force)
    owner.claim([f"eval-{args.split}.json", f"confusion-{args.split}.png", f"reliability-{args.split}.png"])
    return owner


def _write(owner, split: str, text: str, metrics, names: list[str], title: str) -> list[str]:
    """Write the JSON, the confusion matrix and the reliability diagram into the owner's
    folder; the lines that say where they went."""
    if owner is None:
        return ["results not written: the checkpoint is not in a run folder (RUN/checkpoints/); --out DIR keeps them"]
    from vitlab.analysis.plots import plot_confusion, plot_reliability
    from vitlab.files import atomic_write_text

    json_path, png, calib = (owner.path(f"eval-{split}.json"), owner.path(f"confusion-{split}.png"),
                             owner.path(f"reliability-{split}.png"))
    atomic_write_text(json_path, text + "\n")
    try:
        drew = bool(plot_confusion(metrics["confusion"], names, png, title=title))
        plot_reliability(metrics["reliability"], calib, metrics["ece"], title)
    except ImportError:  # matplotlib is an optional extra
        drew = False
    owner.record()
    return [f"results: {json_path}", f"confusion matrix: {png}; reliability diagram: {calib}" if drew
            else "no confusion-matrix or reliability PNG: matplotlib is not installed"]
