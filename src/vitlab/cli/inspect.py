"""Write the four analyses of §4.5 for any checkpoint vitlab can read:
  filters.png               principal components of the patch-embedding filters (Fig. 7 left;
                            for a hybrid, of the ResNet's first convolution)
  position_similarity.png   cosine similarity of the position embeddings (Fig. 7 centre;
                            absent, with the reason, for pos_embed none/relative)
  attention_distance.png    mean attention distance per head and layer (Fig. 7 right, D.7)
  rollout.png               attention rollout over the first images (Fig. 6, D.8)
  analysis.json             every number behind the figures
  index.html                one self-contained page with all of them (images inlined)

--images takes image files, folders or globs, or a data spec (digits, cifar10[:DIR],
fashion-mnist[:DIR], imagefolder:PATH, wds:PATTERN), from which the first --num-images
images of --split are used (the paper averages attention distance over 128 images).

--random-init SEED inspects the checkpoint's shape with random weights (a baseline);
--random-init FIRST-LAST (0-19) inspects that many random draws and writes, as the attention
distance's summary, the mean of each statistic over the draws (a null), each draw's kept.

--heatmap draws the rollout as a colour heat map over each image instead of the image
weighted by the map.

examples:
  vitlab inspect runs/cifar10/checkpoints/last.safetensors --images wds:../shared/data/cifar10 --out inspect/
  vitlab inspect runs/digits/checkpoints/last.safetensors --images digits --out inspect-digits/ --heatmap
  vitlab inspect ViT-B_16.npz --images photos/ --out inspect-b16/ --num-images 32 --device cuda
"""

from __future__ import annotations

import sys
from pathlib import Path

from vitlab.cli.common import COUNT, FOLDER

WRITES = {"out": FOLDER}  # checked writable before any work (vitlab.cli.check_arguments)
READS_DATA = True  # data specs from files may name a pipe: command (--allow-pipe)
HELP = "the paper's look inside a ViT: filters, position similarity, attention distance, rollout"


def add_arguments(p) -> None:
    from vitlab.cli.common import add_checkpoint_arguments, add_device_argument

    add_checkpoint_arguments(p, random_init=False)
    add_device_argument(p)
    p.add_argument("--random-init", metavar="SEED[-LAST]", help="ignore the weights: a random init of the checkpoint's "
                   "shape; a range (0-19) makes the attention distance the mean over those draws (a null)")
    p.add_argument("--images", required=True, metavar="PATH_OR_DATA", help="image files/folders/globs, or a data spec")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the PNGs, analysis.json and index.html")
    p.add_argument("--split", default="test", help="split of a data spec (default test)")
    p.add_argument("--num-images", type=COUNT, default=128, help="images for the attention distance (default 128)")
    p.add_argument("--rollout-images", type=COUNT, default=8, help="images shown in the rollout figure (default 8)")
    p.add_argument("--components", type=COUNT, default=28, help="principal components of the filters shown (default 28)")
    p.add_argument("--batch-size", type=COUNT, default=16)
    p.add_argument("--heatmap", action="store_true", help="draw the rollout as a heat map over each image")
    p.add_argument("--distance", choices=("centres", "pixels"), default="centres",
                   help="attention distance between patch centres (default) or averaged over pixel pairs "
                        "(App. D.7's image-space distance)")
    p.add_argument("--force", action="store_true", help="replace files in --out of a report's names that inspect did not write")


def _batches(args, model):
    """(batches, labels for the rollout titles, a note on the source, how many images there are)."""
    import glob

    import torch

    from vitlab.analysis.inspection import first_batches
    from vitlab.cli import UsageError
    from vitlab.data.image_files import find_images, read_images
    from vitlab.eval.features import open_for_model

    if not (Path(args.images).exists() or glob.has_magic(args.images)):
        dataset = open_for_model(args.images, args.split, model.config, model.class_names)
        count = min(args.num_images, len(dataset)) if hasattr(dataset, "__len__") else args.num_images
        return (first_batches(dataset, args.num_images, args.batch_size), getattr(dataset, "class_names", None),
                f"{args.images} ({args.split} split)", count)
    paths = find_images([args.images])[: args.num_images]
    loaded, failed = read_images(paths, model.config)
    for p, why in failed:
        print(f"vitlab inspect: {p}: {why}; skipped", file=sys.stderr)
    if not loaded:
        raise UsageError(f"{args.images}: none of the files could be read as images")
    x = torch.stack([t for _, t in loaded])
    batches = [x[i : i + args.batch_size] for i in range(0, len(x), args.batch_size)]
    return batches, [p.name for p, _ in loaded], f"{len(loaded)} image file(s) from {args.images}", len(loaded)


def _counted(batches, bar):
    """The batches, each counted on the bar as the analysis takes it."""
    for batch in batches:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        bar.update(min(len(x), bar.total - bar.n))
        yield batch


def run(args) -> int:
    from vitlab.analysis.inspection import inspect_model, random_draws, summary
    from vitlab.checkpoints import open_checkpoint
    from vitlab.config import pick_device
    from vitlab.progress import Progress

    seeds = random_draws(args.random_init)
    model, imported = open_checkpoint(args.checkpoint, args.format, seeds[0] if seeds else None, pick_device(args.device))
    out = Path(args.out)
    batches, labels, source, count = _batches(args, model)  # count: the images there are, up to --num-images
    with Progress(total=count, desc="inspect") as bar:
        report = inspect_model(model, imported, _counted(batches, bar), out, labels=labels, source=source,
                               checkpoint=args.checkpoint, random_init=seeds, max_images=args.num_images,
                               rollout_images=args.rollout_images, components=args.components, heatmap=args.heatmap,
                               distance_mode=args.distance, force=args.force)
    print(summary(report, model.config, imported.source_format, source, out))
    return 0
