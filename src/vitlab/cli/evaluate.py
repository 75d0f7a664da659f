"""`vitlab eval`: accuracy of a checkpoint on a dataset."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "evaluate a checkpoint: top-1/top-5, per-class accuracy, confusion matrix"
DESCRIPTION = """\
Classify a dataset split with any checkpoint vitlab.load reads and report top-1 and top-5
accuracy, the loss, the accuracy of each class and the confusion matrix (a PNG when
matplotlib is installed). Images are preprocessed as the model's config says (its
resolution, channels, mean and std). Results go to OUT/eval-SPLIT.json (OUT defaults to the
run folder of a checkpoint inside RUN/checkpoints/, else ./eval).

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


def add_arguments(p: argparse.ArgumentParser) -> None:
    from vitlab.cli.common import add_checkpoint_arguments, add_device_argument

    add_checkpoint_arguments(p)
    p.add_argument("--data", required=True, metavar="SPEC", help="dataset spec, as for vitlab train")
    p.add_argument("--split", default="test", help="test (default), val, train, dev")
    p.add_argument("--image-size", type=int, metavar="N", help="evaluate at this resolution (position embeddings resized)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=0, help="data-loader worker processes")
    p.add_argument("--skip-bad-images", action="store_true", help="skip and count unreadable images")
    add_device_argument(p)
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    p.add_argument("--out", metavar="DIR", help="where the JSON and the confusion matrix go")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--real", metavar="LABELS.json", help="ImageNet ReaL labels (real.json): ReaL accuracy beside top-1")
    p.add_argument("--force", action="store_true", help="replace files in --out of eval's names that eval did not write")


def run(args: argparse.Namespace) -> int:
    import torch

    from vitlab.analysis.plots import plot_confusion
    from vitlab.cli import UsageError
    from vitlab.cli.common import bad_image_message, open_checkpoint, progress
    from vitlab.config import pick_device
    from vitlab.data import BadImageError, make_loader, open_dataset
    from vitlab.eval.accuracy import evaluate, report, to_json

    device = pick_device(args.device)
    overrides = {"image_size": args.image_size} if args.image_size else {}
    model, _ = open_checkpoint(args.checkpoint, args.format, args.random_init, device, **overrides)
    cfg = model.config
    if cfg.num_classes == 0:
        raise UsageError(f"{args.checkpoint} has no classification head; evaluate it with vitlab fewshot or linear-probe")
    dataset = open_dataset(
        args.data, args.split, image_size=cfg.image_size, in_channels=cfg.in_channels, mean=cfg.mean, std=cfg.std,
        skip_bad_images=args.skip_bad_images,
    )
    names = dataset.class_names
    if len(names) != cfg.num_classes:
        raise UsageError(
            f"{args.checkpoint} predicts {cfg.num_classes} classes but {args.data} has {len(names)}; "
            "fine-tune it first (vitlab finetune) or pick the dataset it was trained on"
        )
    loader = make_loader(dataset, args.batch_size, train=False, num_workers=args.workers)
    bad = 0

    def batches():
        nonlocal bad
        with progress(total=_length(dataset), desc=f"eval {args.split}") as bar:
            for images, labels, skipped in loader:
                bad += len(skipped)  # one evaluation pass: each file once
                bar.update(len(labels) + len(skipped))
                if labels.numel():
                    yield images, labels

    if args.real and args.skip_bad_images:
        raise UsageError("--real pairs each image with its line of the labels: fix unreadable images, do not skip them")
    try:
        metrics = evaluate(model, batches(), cfg.num_classes, device, torch.bfloat16 if args.bf16 else None,
                           keep_predictions=bool(args.real))
    except BadImageError as e:
        raise UsageError(bad_image_message(e)) from None
    if args.real:
        from vitlab.eval.real import read_real_labels, real_accuracy

        labels = read_real_labels(args.real, len(dataset), cfg.num_classes)
        metrics.update(real_accuracy(metrics.pop("predictions"), labels))
    metrics["bad_images_skipped"] = bad
    ckpt = Path(args.checkpoint)
    out = Path(args.out) if args.out else (ckpt.parent.parent / "eval" if ckpt.parent.name == "checkpoints" else Path("eval"))
    from vitlab.files import OutputFolder, atomic_write_text

    owner = OutputFolder(out, "eval", args.force)  # a user's file of these names is never replaced
    json_path, png = owner.path(f"eval-{args.split}.json"), owner.path(f"confusion-{args.split}.png")
    text = to_json(metrics, names)
    atomic_write_text(json_path, text + "\n")
    try:
        drew = bool(plot_confusion(metrics["confusion"], names, png, title=f"{cfg.name} on {args.data}, {args.split}"))
    except ImportError:  # matplotlib is an optional extra
        drew = False
    owner.record()
    if args.json:
        print(text)
    else:
        print(report(metrics, names))
        if args.real:
            from vitlab.eval.real import real_line

            print(real_line(metrics))
        if bad:
            print(f"skipped {bad} unreadable images")
        print(f"\nresults: {json_path}")
        print(f"confusion matrix: {png}" if drew else "no confusion-matrix PNG: matplotlib is not installed")
    return 0


def _length(dataset):
    try:
        return len(dataset)
    except TypeError:  # a stream of unknown length
        return None
