"""`vitlab info CHECKPOINT`: what a checkpoint holds."""

from __future__ import annotations

import json

HELP = "show a checkpoint's format, config, parameter count and classes"
DESCRIPTION = """\
Read a checkpoint in any format vitlab knows (its own .safetensors, and the other formats
listed by `vitlab convert --help`) and print what it holds: the detected format, the model
config vitlab infers, the parameter count and the class names.

examples:
  vitlab info runs/digits/checkpoints/last.safetensors
  vitlab info ViT-B_16.npz --json
"""


def add_arguments(p) -> None:
    p.add_argument("checkpoint", help="a checkpoint file or folder, or a pretrained name")
    p.add_argument("--format", help="the checkpoint's format, when detection cannot tell")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args) -> int:
    from vitlab.checkpoints.describe import describe, serving_line

    info = describe(args.checkpoint, args.format)  # a path, or a name fetched from the Hub
    cfg, params = info["config"], info["params"]
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"checkpoint   {info['path']}")
    print(f"format       {info['format']}")
    if serving_line(info):
        print(f"serving      {serving_line(info)}")
    print(f"model        {cfg['name']}  ({params:,} parameters, {info['gflops']:.3g} GFLOPs at {cfg['image_size'][0]}x{cfg['image_size'][1]})")
    guessed = info["guessed"]
    print("config" + ("       (* a field the file lacks: the value is a default, not the file's)" if guessed else ""))
    for k, v in cfg.items():
        print(f"  {k:<20} {v}" + (f"  * {guessed[k]}" if k in guessed else ""))
    names = info["class_names"]
    if names:
        shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
        print(f"classes      {shown}" + (f"  * {guessed['class_names']}" if "class_names" in guessed else ""))
    else:
        print(f"classes      {cfg['num_classes']} (no names stored)")
    return 0
