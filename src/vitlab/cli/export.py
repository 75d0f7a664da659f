"""Export the plain inference forward (images -> logits) of a checkpoint, with the batch axis
dynamic and the image size fixed at the checkpoint's own (or --image-size, which resizes the
position embeddings before export, so no resampling happens inside the exported graph).

After writing, the file is run and compared with the PyTorch model on random images at batch
sizes 1 and 3: ONNX in onnxruntime, .pt2 through torch.export.load. A difference above
--tolerance (default 1e-4) exits with status 1 and says so; the file is kept for inspection.
An existing --out is never replaced without --force.

An ONNX file carries the class names and the exact preprocessing in its metadata_props (keys
vitlab.*): the resize (kind, size, interpolation), the centre crop, channels, mean and std, one
key each, and vitlab.preprocessing, the sentence made from them, so a runtime needs nothing else. An int8 serving copy
(vitlab.deploy.save_int8) exports with torch-export; ONNX refuses it and says what to do.

examples:
  vitlab export runs/cifar10/checkpoints/last.safetensors --format onnx --out vit.onnx
  vitlab export runs/cifar10/checkpoints/last.safetensors --format torch-export --out vit.pt2
  vitlab export model.safetensors --format onnx --out vit384.onnx --image-size 384
"""

from __future__ import annotations

from pathlib import Path

from vitlab.cli.common import COUNT, FILE

WRITES = {"out": FILE}  # checked writable before any work (vitlab.cli.check_arguments)
HELP = "export a checkpoint to ONNX (dynamic batch) or torch.export (.pt2), and check it"

FORMATS = ("onnx", "torch-export")


def add_arguments(p) -> None:
    p.add_argument("checkpoint", help="a checkpoint in any format vitlab reads")
    p.add_argument("--format", required=True, choices=FORMATS, help="onnx or torch-export (.pt2)")
    p.add_argument("--out", required=True, help="the file to write")
    p.add_argument("--image-size", type=COUNT, help="export at this resolution (position embeddings resized)")
    p.add_argument("--opset", type=COUNT, default=18, help="ONNX opset (default 18)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest accepted |logit| difference")
    p.add_argument("--no-check", action="store_true", help="skip running the exported file")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--device", default="cpu", help="trace and check on this device: cpu (default), cuda, cuda:N, mps; "
                   "a torch-export program keeps it, an ONNX file runs anywhere")


def _check_out(args) -> Path:
    """--out: a file, new unless --force, named as the format's files are (a warning if not)."""
    import sys

    from vitlab.cli import UsageError

    out = Path(args.out)  # (not a folder: the dispatcher's check of WRITES)
    if out.exists() and not args.force:
        raise UsageError(f"--out {out} exists; pass --force to replace it, or pick another path")
    suffix = ".onnx" if args.format == "onnx" else ".pt2"
    if out.suffix != suffix:
        print(f"vitlab export: warning: {out}: an {args.format} file is usually named *{suffix}; runtimes that go "
              "by the suffix may not recognise it", file=sys.stderr)
    if args.format == "onnx":
        from vitlab.extras import require

        require("export", "ONNX export", modules=("onnx", "onnxscript"))
    return out


def run(args) -> int:
    import time

    from vitlab.cli import UsageError
    from vitlab.config import pick_device
    from vitlab.deploy import export
    from vitlab.progress import Progress

    out = _check_out(args)
    model = _load(args).eval().to(pick_device(args.device))
    cfg = model.config
    t0 = time.perf_counter()
    with Progress(total=1 if args.no_check else 2, desc=f"export {args.format}", unit="stage") as bar:
        try:
            if args.format == "onnx":
                export.export_onnx(model, out, opset=args.opset)
            else:
                export.export_program(model, out)
        except ValueError as e:  # a serving copy ONNX cannot hold: the message says what to do
            raise UsageError(str(e)) from None
        bar.update()
        bar.set_description("check")
        size = out.stat().st_size / 2**20
        print(f"wrote {out} ({args.format}, {size:.1f} MiB, {cfg.name} at {cfg.image_size[0]}x{cfg.image_size[1]}, "
              f"dynamic batch) in {time.perf_counter() - t0:.1f} s")
        if args.no_check:
            return 0
        diff, where = _check(args, out, model)
        bar.update()
    verdict = "ok" if diff <= args.tolerance else f"FAILED (tolerance {args.tolerance:g})"
    print(f"checked in {where} at batch 1 and 3: max |logit diff| {diff:.2e} vs PyTorch: {verdict}")
    return 0 if diff <= args.tolerance else 1


def _check(args, out: Path, model) -> tuple[float, str]:
    """(largest logit difference, the runtime that loaded the file back)."""
    from vitlab.cli import UsageError
    from vitlab.deploy import export

    if args.format != "onnx":
        return export.check_program(out, model), "torch.export.load"
    try:
        return export.check_onnx(out, model), "onnxruntime"
    except ImportError:
        raise UsageError("checking needs onnxruntime: pip install 'vitlab[export]', or pass --no-check") from None


def _load(args):
    """The model to export: any checkpoint, or an int8 serving copy (vitlab.deploy.save_int8)."""
    from vitlab.api import load
    from vitlab.checkpoints import io
    from vitlab.cli import UsageError

    path = str(args.checkpoint)
    if path.endswith(".safetensors") and io.detect(Path(path)) and io.read_metadata(path).get(io.SERVING_KEY):
        from vitlab.deploy import load_int8

        if args.image_size:
            raise UsageError("--image-size resizes position embeddings of an fp32 model; an int8 copy is exported "
                             "at its own size")
        return load_int8(path)
    return load(path, **({"image_size": args.image_size} if args.image_size else {}))
