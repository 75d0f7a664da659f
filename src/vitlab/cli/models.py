"""List every registered model variant in the paper's notation, with its width, depth, heads,
MLP size, default resolution, parameter count (at its default number of classes) and the
forward cost of one image in GFLOPs (2 x multiply-accumulates of the matrix products and
convolutions). For a BiT ResNet, width is the representation's (the last stage's output)
and depth the layer count of its name (R50: 50); heads, MLP and tokens do not apply.

With a PATTERN (shell-style, any case) only the matching names; with --pretrained the
published checkpoints instead (MODEL:WEIGHTS, what vitlab.list_models(PATTERN,
pretrained=True) returns), with their resolution, classes, training data and source.

examples:
  vitlab models
  vitlab models 'ViT-B*' --pretrained
  vitlab models --image-size 384 --num-classes 1000
  vitlab models --json
"""

from __future__ import annotations

import json

from vitlab.cli.common import COUNT

HELP = "list the model variants with parameters and GFLOPs"


def add_arguments(p) -> None:
    p.add_argument("pattern", nargs="?", help="only names matching this shell-style pattern ('ViT-B*')")
    p.add_argument("--pretrained", action="store_true", help="list the published checkpoints instead of the variants")
    p.add_argument("--image-size", type=COUNT, help="count at this resolution instead of each model's default")
    p.add_argument("--num-classes", type=COUNT, help="count with this many classes instead of each default")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _cell(value) -> str:
    return "-" if value is None else str(value)


def run(args) -> int:
    from vitlab.api import list_models, model_table
    from vitlab.checkpoints.pretrained import pretrained_rows
    from vitlab.cli import UsageError

    if args.pretrained:
        table, noun, flag = pretrained_rows(list_models(args.pattern, pretrained=True)), "published checkpoint", " --pretrained"
    else:
        table, noun, flag = model_table(args.image_size, args.num_classes, args.pattern), "model variant", ""
    if not table:
        raise UsageError(f"no {noun} matches {args.pattern!r}; `vitlab models{flag}` lists them all")
    if args.json:
        print(json.dumps(table, indent=2))
    elif args.pretrained:
        print(f"{'name':<38} {'image':>5} {'classes':>7}  trained on")
        for r in table:
            print(f"{r['name']:<38} {r['resolution']:>5} {r['classes']:>7}  {r['dataset']}")
    else:
        head = f"{'model':<14} {'image':>7} {'width':>5} {'depth':>5} {'heads':>5} {'mlp':>5} {'tokens':>6} {'classes':>7} {'params':>13} {'GFLOPs':>8}"
        print(head)
        print("-" * len(head))
        for r in table:
            print(f"{r['name']:<14} {r['image_size']:>7} {r['width']:>5} {r['depth']:>5} {_cell(r['heads']):>5} "
                  f"{_cell(r['mlp']):>5} {_cell(r['tokens']):>6} {r['classes']:>7} {r['params']:>13,} {r['gflops']:>8.2f}")
    return 0
