"""Is decoding at a reduced DCT scale honest? A trained model's top-1 with and without it.

    python benchmarks/decode_accuracy.py runs/c4-tiny/checkpoints/last.safetensors

The model of benchmarks/results/decode-accuracy.md was trained (80 CPU-seconds) by
    vitlab train --config cifar10 --data wds:../shared/data/cifar10 --model ViT-C/4 --steps 600 \
        --batch-size 64 --warmup-steps 10 --eval-every 0 model.hidden_size=64 model.depth=4 \
        model.num_heads=2 model.mlp_dim=128 train.threads=1 --out runs/c4-tiny

The 10,000 CIFAR-10 test images of ../shared/data, upsampled (bicubic) to ImageNet's typical
500x375 and re-encoded as JPEG at quality 90, are evaluated by a trained model twice: decoded
in full and then resized by the model's evaluation transform (what timm and Hugging Face do),
and decoded at the largest DCT reduction that still leaves MARGIN times what the resize makes
(`data.eval_decode=fast` uses 2; for a 32-px model 1/4, 125x94 pixels; --margin 1 gives 1/8). Reports both top-1, their
agreement and the mean absolute difference of the model's input pixels (in grey levels of
0-255). Writes benchmarks/results/decode-accuracy.md and .csv.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import torch
from PIL import Image

import report_tables as tables  # noqa: E402  (this folder's module: the script's folder is on sys.path)
import vitlab
from vitlab.bench import machine
from vitlab.data import decode as D
from vitlab.data.datasets import Encoded, read_image
from vitlab.data.tar_shards import iter_shard
from vitlab.data.transforms import eval_transform

SHARDS = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "cifar10"


def test_images(limit: int) -> list[tuple[bytes, int]]:
    out = []
    for shard in sorted(SHARDS.glob("test-*.tar*")):
        for _, parts in iter_shard(shard):
            big = Image.open(io.BytesIO(parts["jpg"])).convert("RGB").resize((500, 375), Image.BICUBIC)
            buf = io.BytesIO()
            big.save(buf, format="JPEG", quality=90)
            out.append((buf.getvalue(), int(parts["cls"].decode())))
            if len(out) == limit:
                return out
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--limit", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=250)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--name", default="decode-accuracy")
    ap.add_argument("--margin", type=int, default=2, help="decode at a scale leaving MARGIN x the resize's size")
    ap.add_argument("--description", default="", help="how the model was trained, for the table's notes")
    args = ap.parse_args()
    model = vitlab.load(args.checkpoint).eval()
    c = model.config
    common = dict(mean=c.mean, std=c.std, in_channels=c.in_channels, crop_fraction=c.crop_fraction,
                  crop_mode=c.crop_mode, interpolation=c.interpolation)
    full_t = eval_transform(c.image_size, **common)
    fast_t = D.fast_eval_transform(c.image_size, **common, margin=args.margin)
    images = test_images(args.limit)
    print(f"{len(images)} images re-encoded", file=sys.stderr)
    correct = {"full": 0, "fast": 0}
    agree, pixel_sum, seconds = 0, 0.0, {"full": 0.0, "fast": 0.0}
    with torch.inference_mode():
        for start in range(0, len(images), args.batch):
            chunk = images[start:start + args.batch]
            labels = torch.tensor([y for _, y in chunk])
            t0 = time.thread_time()
            full = torch.stack([full_t(read_image(io.BytesIO(data))) for data, _ in chunk])
            t1 = time.thread_time()
            fast = torch.stack([fast_t(Encoded(data, f"test image {start + k}")) for k, (data, _) in enumerate(chunk)])
            t2 = time.thread_time()
            seconds["full"] += t1 - t0
            seconds["fast"] += t2 - t1
            std = torch.tensor(c.std).view(1, -1, 1, 1)
            pixel_sum += ((full - fast).abs() * std * 255).mean(dim=(1, 2, 3)).sum().item()
            p_full, p_fast = model(full).argmax(1), model(fast).argmax(1)
            correct["full"] += int((p_full == labels).sum())
            correct["fast"] += int((p_fast == labels).sum())
            agree += int((p_full == p_fast).sum())
    n = len(images)
    records = [{
        "decoding": name, "images": str(n), "top-1 %": f"{100 * correct[key] / n:.2f}",
        "top-1 agreement with full %": "100.00" if key == "full" else f"{100 * agree / n:.2f}",
        "mean abs pixel difference (0-255)": "0" if key == "full" else f"{pixel_sum / n:.3f}",
        "decode + transform, img/s per core": f"{n / seconds[key]:.0f}",
    } for key, name in (("full", "full decode (default)"), ("fast", f"at the DCT scale leaving {args.margin}x the resize's size"))]
    delta = 100 * (correct["fast"] - correct["full"]) / n
    notes = (f"Model: {args.description or c.name} at {c.image_size[0]}x{c.image_size[1]}. Images: the CIFAR-10 test "
             f"set upsampled (bicubic) to 500x375, JPEG quality 90. Top-1 difference fast - full: {delta:+.2f} points "
             "(the goal: within 0.1). Speeds are one thread's CPU time on a shared machine, not an interleaved "
             "benchmark.\n")
    columns = list(records[0])
    tables.write_table(args.out, args.name, "Reduced-scale decoding: top-1 of a trained model",
                       machine.machine_info(), records, columns, notes)
    print(tables.table(records, columns))
    print(notes)


if __name__ == "__main__":
    main()
