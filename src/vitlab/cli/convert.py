"""Read a checkpoint in any format vitlab knows (detected from the file, or named with --from),
or a pretrained name such as ViT-B/16:imagenet21k, and write it in another format:

  vitlab       one .safetensors file with the config and class names (vitlab.load reads it)
  npz          the official JAX layout (the official code and timm's npz reader load it)
  timm         a timm VisionTransformer state dict (.safetensors or .pth)
  hf           a Hugging Face save_pretrained folder (ViTForImageClassification / ViTModel)
  torchvision  a torchvision VisionTransformer state dict (.pth)

A model the target cannot represent exactly (a GAP model for Hugging Face, a pre-logits
layer for timm, ...) is refused with the feature named. When only the numerics differ (the
target's GELU form or weight standardisation), --allow-numerics-change writes anyway. A file
that cannot carry a setting the model needs (a .pth state dict stores no head count and no
GELU form) is refused the same way; write .safetensors, which carries vitlab's config. The
written file is loaded back as a model and its logits on a probe batch are compared with
the original's before it replaces DST. DST is never overwritten without --force, and --force
on a Hugging Face folder replaces only the files vitlab writes (a README or .git stays).

torchvision's ViT takes RGB images and computes the exact GELU: the official weights (tanh
GELU) go there with --allow-numerics-change, and a 1-channel model (the digits run) has no
torchvision form at all; write it as vitlab, timm or npz instead.

examples:
  vitlab convert ViT-B_16.npz vit_b16_hf --to hf
  vitlab convert vit_b16_hf model.safetensors --to vitlab
  vitlab convert timm_vit_small.pth small.npz --to npz --allow-numerics-change
  vitlab convert ViT-B_16.npz vit_b16_tv.pth --to torchvision --allow-numerics-change
  vitlab convert runs/digits/checkpoints/last.safetensors last.npz --to npz
"""

from __future__ import annotations

HELP = "convert a checkpoint between vitlab, official .npz, timm, Hugging Face and torchvision"

TARGETS = ("vitlab", "npz", "timm", "hf", "torchvision")


def add_arguments(p) -> None:
    p.add_argument("src", help="a checkpoint file or folder, or a pretrained name (ViT-B/16:imagenet21k)")
    p.add_argument("dst", help="the file or folder to write")
    p.add_argument("--to", choices=TARGETS, help="the format to write (default: from DST's suffix, .npz or .safetensors)")
    p.add_argument("--from", dest="source_format", metavar="FORMAT", help="the format of SRC, when detection cannot tell")
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.add_argument("--allow-numerics-change", action="store_true",
                   help="write even when the target computes a slightly different function (GELU form, epsilon)")
    p.add_argument("--no-verify", action="store_true", help="skip loading DST back and comparing its logits")


def _target(args) -> str:
    from pathlib import Path

    from vitlab.cli import UsageError

    target = args.to or {".npz": "npz", ".safetensors": "vitlab"}.get(Path(args.dst).suffix)
    if target:
        return target
    raise UsageError(f"cannot tell the format to write from {args.dst!r}; pass --to ({', '.join(TARGETS)})")


def check(args) -> None:
    """The destination, a folder for --to hf, checked writable before the source is read."""
    from vitlab.files import check_writable

    check_writable(args.dst, folder=args.to == "hf")


def run(args) -> int:
    from pathlib import Path

    from vitlab import checkpoints
    from vitlab.cli import UsageError

    target = _target(args)
    src, dst = args.src, Path(args.dst)
    if dst.exists() and Path(src).resolve() == dst.resolve():
        raise UsageError(f"{dst} is the source itself; write to another path")
    if dst.exists() and not args.force:
        raise UsageError(f"{dst} exists; pass --force to replace it, or pick another path")
    if dst.is_dir() and target != "hf":
        raise UsageError(f"{dst} is a folder; a {target} checkpoint is one file: give a file name")
    from vitlab.progress import Progress

    with Progress(total=2, desc="read", unit="stage") as bar:
        imported = checkpoints.read_checkpoint(src, args.source_format)
        model = checkpoints.build_model(imported, src)
        bar.update()
        # One stage: the file is written beside DST, loaded back and compared before it moves in.
        bar.set_description(f"write {target}" if args.no_verify else f"write {target} and verify")
        kwargs = {} if target == "vitlab" else {"allow_numerics_change": args.allow_numerics_change}
        result = checkpoints.save_verified(model, dst, target, verify_logits=not args.no_verify, **kwargs)
        bar.update()
    _report(args, src, dst, target, imported, model, result)
    return 0


def _report(args, src, dst, target: str, imported, model, result) -> None:
    """What was read and written, the verification, and how the target's library builds the model."""
    import json
    import sys

    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    print(f"read   {src}  ({imported.source_format}: {cfg.name}, {params:,} parameters, {cfg.image_size[0]}x{cfg.image_size[1]})")
    print(f"wrote  {dst}  ({target})")
    for note in result.warnings:
        print(f"vitlab convert: warning: {note}", file=sys.stderr)
    if not args.no_verify:
        if result.exact:
            how = "gives identical logits on a probe batch"
        elif any("will differ" in w for w in result.warnings):
            how = f"gives logits up to {result.max_diff:.3g} away on a probe batch, from the settings it does not carry"
        else:
            how = f"gives logits within {result.max_diff:.3g} on a probe batch"
        print(f"verified: {dst}, loaded back as a model, {how}")
    if target == "timm":
        from vitlab.checkpoints.timm import timm_model_args

        print(f"timm arguments: {json.dumps(timm_model_args(cfg))}")
        print("  (vitlab.checkpoints.timm.create_timm_model(config) builds the matching timm model)")
    if target == "torchvision":
        print("torchvision model: vitlab.checkpoints.torchvision.create_torchvision_model(config) builds it")
