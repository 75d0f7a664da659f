"""Read a checkpoint in any format vitlab knows (its own .safetensors, and the other formats
listed by `vitlab convert --help`) and print what it holds: the detected format, the model
config vitlab infers, the parameter count and the class names.

With --kernels it also says which kernel vitlab's CPU inference copies run for each of the
model's Dense shapes and its attention on this machine (fp32, and bf16 where oneDNN runs it),
and why: the time per image of each candidate, measured here once (a few seconds) and then
read from the per-machine cache (vitlab.deploy.kernels, docs/performance.md).

examples:
  vitlab info runs/digits/checkpoints/last.safetensors
  vitlab info ViT-B_16.npz --json
  vitlab info runs/digits/checkpoints/last.safetensors --kernels
"""

from __future__ import annotations

import json

HELP = "show a checkpoint's format, config, parameter count and classes"


def add_arguments(p) -> None:
    p.add_argument("checkpoint", help="a checkpoint file or folder, or a pretrained name")
    p.add_argument("--format", help="the checkpoint's format, when detection cannot tell")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--kernels", action="store_true", help="also the CPU kernel of each Dense shape and attention here, and why")


def run(args) -> int:
    from vitlab.checkpoints.describe import describe, serving_line
    from vitlab.deploy.kernels import describe as cpu_kernels

    info = describe(args.checkpoint, args.format)  # a path, or a name fetched from the Hub
    cfg, params = info["config"], info["params"]
    if args.kernels:  # which kernel the CPU inference copies run for each shape here, and why
        info["cpu_kernels"] = cpu_kernels(cfg)
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
    if args.kernels:
        print("cpu kernels  " + ("\n" + " " * 13).join(f"{c['what']}: {c['kernel']} ({c['why']})" for c in info["cpu_kernels"]))
    return 0

