"""Rows of the paper's Tables 5 and 6, reproduced with vitlab and printed beside the paper's.

    python benchmarks/paper_tables.py compute
        Table 6's pretraining compute (exaFLOPs) of every model at its epochs of JFT-300M
        (303M images), from vitlab's own FLOP count (3 x forward FLOPs x images seen, the
        count `vitlab train` reports). Arithmetic only: runs anywhere in a second.

    python benchmarks/paper_tables.py table5 --checkpoints DIR --imagenet-val VAL [--real real.json]
        Table 5's ImageNet and ImageNet ReaL cells of the ImageNet-21k column: the official
        checkpoints fine-tuned on ImageNet at 384 px (the imagenet21k+imagenet2012 release:
        DIR/ViT-B_16.npz, ViT-B_32.npz, ViT-L_16.npz, ViT-L_32.npz, ...), evaluated at 384 on
        the 50,000 validation images (imagenet-val:VAL, file-name order) and their ReaL
        labels. A model whose file is absent is listed as absent.

Both write benchmarks/results/paper-tables-*.md and .csv (or --out DIR). What a full table5
run needs is in docs/reproducing.md (about 6.4 GB of ImageNet validation images, the
checkpoints, and under half an hour of one GPU for the four B and L models at 384).

The paper's numbers below are quoted from arXiv 2010.11929 v2. Only ViT-B/16's 83.97% is
also in the project's notes (../shared/docs/paper.md); the rest were transcribed from the
paper's Tables 5 and 6 for this script.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

from vitlab.tables import csv_table, markdown_table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
JFT_IMAGES = 303e6  # JFT-300M: 303M images (§4.1)

# Table 6: (model, epochs of JFT-300M) -> pretraining exaFLOPs.
TABLE6_EXAFLOPS = {
    ("ViT-B/32", 7): 55, ("ViT-B/16", 7): 224, ("ViT-L/32", 7): 196, ("ViT-L/16", 7): 783,
    ("ViT-L/16", 14): 1567, ("ViT-H/14", 14): 4262,
    ("BiT-R50x1", 7): 50, ("BiT-R50x2", 7): 199, ("BiT-R101x1", 7): 96, ("BiT-R152x1", 7): 141,
    ("BiT-R152x2", 7): 563, ("BiT-R152x2", 14): 1126, ("BiT-R200x3", 14): 3306,
    ("R50+ViT-B/32", 7): 106, ("R50+ViT-B/16", 7): 274, ("R50+ViT-L/32", 7): 246, ("R50+ViT-L/16", 7): 859,
    ("R50+ViT-L/16", 14): 1668,
}

# Table 5, the ImageNet-21k column: model -> (ImageNet top-1, ImageNet ReaL), fine-tuned at 384.
TABLE5_IN21K = {
    "ViT-B/16": (83.97, 88.35), "ViT-B/32": (81.28, 86.63), "ViT-L/16": (85.15, 88.40),
    "ViT-L/32": (80.99, 85.65), "ViT-H/14": (85.13, 88.70),
}


def official_file(model: str) -> str:
    """The official release's file name: ViT-B/16 -> ViT-B_16.npz."""
    return model.replace("/", "_") + ".npz"


def compute_rows() -> list[dict[str, Any]]:
    """Table 6's compute column: vitlab's count beside the paper's."""
    import vitlab
    from vitlab.train.compute import training_flops

    rows = []
    for (model, epochs), paper in TABLE6_EXAFLOPS.items():
        ours = training_flops(vitlab.get_config(model), epochs * JFT_IMAGES) / 1e18
        rows.append({"model": model, "epochs": epochs, "vitlab_exaflops": round(ours, 1), "paper_exaflops": paper,
                     "ratio": round(ours / paper, 3)})
    return rows


def evaluate_official(path: Path, val: str, real: Optional[str], image_size: int, batch_size: int,
                      device: str) -> dict[str, Any]:
    """Top-1 and ReaL of one official fine-tuned checkpoint on the validation set."""
    import torch

    import vitlab
    from vitlab.data import open_dataset
    from vitlab.eval.accuracy import evaluate
    from vitlab.eval.real import read_real_labels, real_accuracy

    model = vitlab.load(path, image_size=image_size).to(device).eval()
    cfg = model.config
    data = open_dataset(f"imagenet-val:{val}", "test", vitlab.transform(model))  # the checkpoint's own preprocessing
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size, num_workers=4 if device != "cpu" else 0)
    metrics = evaluate(model, ((x, y) for x, y in loader), cfg.num_classes, device, keep_predictions=True)
    out = {"top1": metrics["top1"], "images": metrics["count"], "real_top1": None}
    if real:
        out.update(real_accuracy(metrics["predictions"], read_real_labels(real, len(data), cfg.num_classes)))
    return out


def table5_rows(checkpoints: Path, val: str, real: Optional[str], image_size: int = 384, batch_size: int = 64,
                device: str = "cpu") -> list[dict[str, Any]]:
    rows = []
    for model, (paper_top1, paper_real) in TABLE5_IN21K.items():
        path = checkpoints / official_file(model)
        row: dict[str, Any] = {"model": model, "checkpoint": str(path), "paper_imagenet": paper_top1,
                               "paper_real": paper_real, "imagenet": None, "real": None}
        if path.is_file():
            r = evaluate_official(path, val, real, image_size, batch_size, device)
            row.update(imagenet=round(100 * r["top1"], 2), images=r["images"],
                       real=None if r["real_top1"] is None else round(100 * r["real_top1"], 2))
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """The rows as Markdown (vitlab.tables), an absent value written as absent."""
    return markdown_table(columns, [["absent" if r.get(c) is None else r.get(c) for c in columns] for r in rows])


def write(rows: list[dict[str, Any]], columns: list[str], out: Path, name: str, note: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    text = f"# {name}\n\n{note}\n\n" + markdown(rows, columns)
    (out / f"paper-tables-{name}.md").write_text(text)
    (out / f"paper-tables-{name}.csv").write_text(csv_table(columns, [[r.get(c) for c in columns] for r in rows]))
    return text


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="table", required=True)
    sub.add_parser("compute", help="Table 6's pretraining exaFLOPs, from vitlab's FLOP count")
    t5 = sub.add_parser("table5", help="Table 5's ImageNet and ReaL cells from the official fine-tuned checkpoints")
    t5.add_argument("--checkpoints", required=True, type=Path, help="folder of the official ViT-*.npz files (384 px)")
    t5.add_argument("--imagenet-val", required=True, help="the validation images (as imagenet-val:DIR reads them)")
    t5.add_argument("--real", help="ImageNet ReaL labels, real.json")
    t5.add_argument("--image-size", type=int, default=384)
    t5.add_argument("--batch-size", type=int, default=64)
    t5.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the .md and .csv go (default benchmarks/results)")
    args = p.parse_args(argv)
    if args.table == "compute":
        columns = ["model", "epochs", "vitlab_exaflops", "paper_exaflops", "ratio"]
        note = ("Table 6's pretraining compute: 3 x forward FLOPs (vitlab's count, `vitlab models`) x 303M images x "
                "epochs, beside the paper's exaFLOPs.")
        print(write(compute_rows(), columns, args.out, "compute", note))
        return 0
    if not args.checkpoints.is_dir():
        print(f"paper_tables.py: error: --checkpoints {args.checkpoints} is not a folder", file=sys.stderr)
        return 2
    rows = table5_rows(args.checkpoints, args.imagenet_val, args.real, args.image_size, args.batch_size, args.device)
    columns = ["model", "imagenet", "paper_imagenet", "real", "paper_real", "images"]
    note = (f"Table 5, ImageNet-21k column: official fine-tuned checkpoints from {args.checkpoints}, evaluated at "
            f"{args.image_size} px on imagenet-val:{args.imagenet_val}" + (f" with ReaL labels {args.real}" if args.real
                                                                           else " (no ReaL labels given)") + ".")
    print(write(rows, columns, args.out, "table5", note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
