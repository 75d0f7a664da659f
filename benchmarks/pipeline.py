"""The input pipeline per core: vitlab beside torchvision's ImageFolder and timm's loader, and
beside the limit (decoding alone), on the same photographs, interleaved in one run.

    python benchmarks/pipeline.py                    # about 6 minutes on one quiet core
    python benchmarks/pipeline.py --rounds 2 --quick
    python benchmarks/pipeline.py --gpu --rounds 3   # on a CUDA machine (benchmarks/gpu.sh)

Photographs: Debian's mate-backgrounds (/usr/share/backgrounds/mate: 14 photographs of
1280x1024 to 5640x3172; `apt-get install mate-backgrounds`), cut into 4:3 tiles at several
scales and resized to ImageNet's typical 500x375, JPEG quality 90 (168 images); and, to show
where decoding at a reduced DCT scale pays, the same photographs at 1600x1200. Without that
package: the CIFAR-10 test images of ../shared/data, upsampled to 500x375 (the table says
which).

Every system reads the same folder in one process with one thread (torch.set_num_threads(1),
num_workers=0), batches of 24, and is timed by the CPU time of that thread: images per second
per core. The training transform is the Inception crop (scale 0.08-1, ratio 3/4-4/3) to 224,
a horizontal flip and normalisation (vitlab's fast path hands uint8 batches to the training
process, which normalises them on its device; `vitlab.transform(model, train=True)` is the
same path with the normalisation done in the transform, float batches out, as torchvision's);
evaluation is resize to 256, centre crop 224, normalise.
Systems are shuffled in every round; other processes' CPU use during each sample is read from
/proc/stat. Writes benchmarks/results/pipeline.md, pipeline.csv, pipeline-profile.md (each stage's
share of the fast path) and pipeline-cores.md (the cores a GPU's ViT-B/16 training needs).
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from PIL import Image

import report_tables as tables  # noqa: E402  (this folder's module: the script's folder is on sys.path)
import vitlab
from vitlab.bench import machine
from vitlab.data import DataOptions, decode as D, images, make_loader, open_dataset
from vitlab.data.transforms import eval_transform, fast_eval_transform, train_transform
from vitlab.files import atomic_write_text

MATE = Path("/usr/share/backgrounds/mate")
PHOTOS = ("Elephants_5640x3172", "Aqua", "Blinds", "Dune", "FreshFlower", "Garden", "GreenMeadow", "LadyBird",
          "RainDrops", "Storm", "TwoWings", "Wood", "YellowFlower", "GreenTraditional")
SHARDS = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "cifar10"
BATCH = 24
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def make_photos(root: Path, size: tuple[int, int], per_photo: int) -> str:
    """An ImageFolder of JPEGs (quality 90) at `size` (w, h); returns what they are."""
    found = {p.stem: p for p in MATE.rglob("*.jpg")} if MATE.is_dir() else {}
    names = [n for n in PHOTOS if n in found]
    if names:
        for name in names:
            im = Image.open(found[name]).convert("RGB")
            for k in range(per_photo):
                f = (1.0, 0.7, 0.5, 0.35)[k % 4]
                h = int(im.height * f)
                w = min(im.width, int(h * 4 / 3))
                x, y = (im.width - w) * (k % 3) // 2, (im.height - h) * ((k // 4) % 3) // 2
                tile = im.crop((x, y, x + w, y + h)).resize(size, Image.LANCZOS)
                (root / name).mkdir(parents=True, exist_ok=True)
                tile.save(root / name / f"{k:02d}.jpg", quality=90)
        return f"{len(names)} photographs of Debian's mate-backgrounds, {per_photo} tiles each at {size[0]}x{size[1]}"
    from vitlab.data.tar_shards import iter_shard

    for n, (key, parts) in enumerate(iter_shard(sorted(SHARDS.glob("test-*.tar*"))[0])):
        if n == 14 * per_photo:
            break
        folder = root / parts["cls"].decode().strip()
        folder.mkdir(parents=True, exist_ok=True)
        Image.open(io.BytesIO(parts["jpg"])).convert("RGB").resize(size, Image.BICUBIC).save(
            folder / f"{Path(key).name}.jpg", quality=90)
    return f"CIFAR-10 test images upsampled to {size[0]}x{size[1]} (no mate-backgrounds installed)"


def _drain(loader, normalise: Callable = lambda x: x) -> int:
    n = 0
    for batch in loader:
        normalise(batch[0])
        n += batch[0].shape[0]
    return n


def systems(root: Path, files: list[Path], train: bool) -> dict[str, Callable[[], int]]:
    """name -> a function that processes every image once and returns how many it did."""
    import timm.data
    import torchvision
    from torchvision import transforms as T

    steps = len(files) // BATCH
    spec = f"imagefolder:{root}"
    common = dict(options=DataOptions(test_fraction=0.0001))
    if train:
        fast = open_dataset(spec, "train", train_transform(224, MEAN, STD, uint8=True), train=True, **common)
        model = vitlab.get_config("ViT-B/16", mean=MEAN, std=STD)  # vitlab.transform's model: 224 px, bilinear
        public = open_dataset(spec, "train", vitlab.transform(model, train=True), train=True, **common)
        pil = open_dataset(spec, "train", train_transform(224, MEAN, STD, decode="pil"), train=True, **common)
        tv_t = T.Compose([T.RandomResizedCrop(224, antialias=True), T.RandomHorizontalFlip(), T.ToTensor(),
                          T.Normalize(MEAN, STD)])
        timm_loader = timm.data.create_loader(
            timm.data.ImageDataset(str(root)), input_size=(3, 224, 224), batch_size=BATCH, is_training=True,
            use_prefetcher=False, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5, color_jitter=None,
            auto_augment=None, re_prob=0.0, interpolation="bilinear", mean=MEAN, std=STD, num_workers=0)
        out = {
            "vitlab (data.decode=fast: uint8 batches, as the workers hand them over)":
                lambda: _drain(make_loader(fast, BATCH, num_steps=steps)),
            "vitlab.transform(model, train=True): the same fast path, normalised in the transform":
                lambda: _drain(make_loader(public, BATCH, num_steps=steps)),
            "vitlab (data.decode=pil: decoded, cropped and resized by PIL)":
                lambda: _drain(make_loader(pil, BATCH, num_steps=steps)),
        }
    else:
        crop = dict(crop_fraction=0.875, crop_mode="center")
        fast = open_dataset(spec, "train", fast_eval_transform(224, MEAN, STD, **crop), **common)
        pil = open_dataset(spec, "train", eval_transform(224, MEAN, STD, **crop), **common)
        tv_t = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
        timm_t = timm.data.create_transform(224, is_training=False, crop_pct=0.875, interpolation="bilinear",
                                            mean=MEAN, std=STD)
        timm_loader = timm.data.create_loader(
            timm.data.ImageDataset(str(root), transform=timm_t), input_size=(3, 224, 224), batch_size=BATCH,
            is_training=False, use_prefetcher=False, crop_pct=0.875, interpolation="bilinear", mean=MEAN, std=STD,
            num_workers=0)
        timm_loader.dataset.transform = timm_t
        out = {
            "vitlab (full decode, the default)": lambda: _drain(make_loader(pil, BATCH, train=False)),
            "vitlab (data.eval_decode=fast, opt-in)": lambda: _drain(make_loader(fast, BATCH, train=False)),
        }
    tv = torchvision.datasets.ImageFolder(str(root), transform=tv_t)
    out["torchvision ImageFolder"] = lambda: _drain(torch.utils.data.DataLoader(tv, BATCH, shuffle=train))
    out["timm create_loader"] = lambda: _drain(timm_loader)
    return out


def limits(files: list[Path]) -> dict[str, Callable[[], int]]:
    """Decoding alone: in full (PIL, torchvision.io), and at the scale the crop would need."""
    from torchvision.io import decode_jpeg

    datas = [f.read_bytes() for f in files]
    shown = [Image.open(f).size[::-1] for f in files]

    def pil_full() -> int:
        for d in datas:
            Image.open(io.BytesIO(d)).load()
        return len(datas)

    def tv_full() -> int:
        for d in datas:
            decode_jpeg(torch.frombuffer(bytearray(d), dtype=torch.uint8))
        return len(datas)

    def at_crop_scale() -> int:
        for d, (h, w) in zip(datas, shown, strict=True):
            box = D.draw_box(h, w, (0.08, 1.0), (3 / 4, 4 / 3), True)
            im = Image.open(io.BytesIO(d))
            s = D.dct_scale((box.height, box.width), (224, 224))
            if s > 1:
                im.draft(None, (im.width // s, im.height // s))
            im.load()
        return len(datas)

    return {"limit: decode only, full size (PIL)": pil_full, "limit: decode only, full size (torchvision.io)": tv_full,
            "limit: decode only, at the Inception crop's scale (PIL draft)": at_crop_scale}


def gpu_rows(files: list[Path], rounds: int, device: str = "cuda", batch: int = 128) -> list[dict]:
    """data.decode=cuda: the CPU's share (reading the header, drawing the box) per core, and
    the device's (nvjpeg decode, crop, resize, flip, normalise of a batch) per second."""
    from vitlab.data.datasets import Encoded

    plan = train_transform(224, MEAN, STD, decode="cuda")
    normalise = (MEAN, STD)
    encoded = [Encoded(f, str(f)) for f in files]
    planned = [plan(e) for e in (encoded * (batch // len(encoded) + 1))[:batch]]
    D.decode_planned(planned, (224, 224), device, normalise)  # warm-up: nvjpeg handles, kernels
    sync = machine.device_sync(device)
    rows = []
    for _ in range(rounds):
        t0 = time.thread_time()
        for e in encoded:
            plan(e)
        cpu_rate = len(encoded) / (time.thread_time() - t0)
        sync()
        t0 = time.perf_counter()
        for _ in range(5):
            D.decode_planned(planned, (224, 224), device, normalise)
        sync()
        rows.append((cpu_rate, 5 * len(planned) / (time.perf_counter() - t0)))
    return [{"photos": "500x375", "transform": "train", "system": "data.decode=cuda: planning on the CPU (per core)",
             "img/s per core": f"{statistics.median(r[0] for r in rows):.0f}", "samples": str(rounds)},
            {"photos": "500x375", "transform": "train", "system": f"data.decode=cuda: decode and augment on {device}, "
             f"batch {batch} (img/s of the device)", "wall img/s": f"{statistics.median(r[1] for r in rows):.0f}",
             "samples": str(rounds)}]


def stage_profile(files: list[Path], reps: int = 3) -> list[dict]:
    """Where the fast training transform's time goes: each stage timed by the thread's CPU
    time, summed over the images (the loader's batching shown apart)."""
    from torch.nn import functional as NF


    spent: dict[str, float] = {}

    def tick(stage: str, t0: float) -> float:
        t = time.thread_time()
        spent[stage] = spent.get(stage, 0.0) + t - t0
        return t

    for _ in range(reps):
        for f in files:
            t = time.thread_time()
            data = f.read_bytes()
            im = images.open_image(data, str(f))
            full = D.shown_size(im)
            t = tick("read the file, parse the JPEG header", t)
            box = D.draw_box(*full, (0.08, 1.0), (3 / 4, 4 / 3), True)
            t = tick("draw the box and the flip", t)
            x = D.decode_uint8(im, data, str(f), D.dct_scale((box.height, box.width), (224, 224)), 3)
            t = tick("decode (at the crop's DCT scale)", t)
            left, top, right, bottom = D.scaled(box, full, tuple(x.shape[-2:]))
            crop = x[None, :, top:bottom, left:right].contiguous(memory_format=torch.channels_last)
            t = tick("cut the crop", t)
            y = NF.interpolate(crop, (224, 224), mode="bilinear", align_corners=False, antialias=True)[0]
            t = tick("resize to 224 (uint8, antialiased)", t)
            if box.flip:
                y = y.flip(-1)
            tick("flip", t)
    total = sum(spent.values())
    return [{"stage": k, "ms per image": f"{1e3 * v / (reps * len(files)):.3f}", "share": f"{v / total:.0%}"}
            for k, v in spent.items()]


def measure(fn: Callable[[], int]) -> dict[str, float]:
    with machine.CpuMeter() as meter:
        t0 = time.thread_time()
        n = fn()
        cpu = time.thread_time() - t0
    return {"per_core": n / cpu, "wall": n / meter.wall, "others": meter.others}


def run(args: argparse.Namespace, profiles: dict[str, list[dict]]) -> list[dict]:
    torch.set_num_threads(1)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        sets = [("500x375", (500, 375), 3 if args.quick else 12)]
        if not args.quick:
            sets.append(("1600x1200", (1600, 1200), 3))
        for label, size, per_photo in sets:
            root = Path(tmp) / label
            what = make_photos(root, size, per_photo)
            files = sorted(root.rglob("*.jpg"))
            print(f"{label}: {what}: {len(files)} images", file=sys.stderr)
            for task in ("train", "eval"):
                chosen = {**systems(root, files, task == "train"), **(limits(files) if task == "train" else {})}
                samples: dict[str, list[dict]] = {name: [] for name in chosen}
                for fn in chosen.values():
                    fn()  # warm-up: file cache, imports, first allocations
                for r in range(args.rounds):
                    order = list(chosen)
                    random.Random(r).shuffle(order)
                    for name in order:
                        machine.wait_quiet(args.contended, args.max_wait)
                        samples[name].append(measure(chosen[name]))
                records += summarise(label, what, task, samples, args.contended)
            profiles[label] = stage_profile(files)
    return records


def summarise(label: str, what: str, task: str, samples: dict[str, list[dict]], contended: float) -> list[dict]:
    base = samples["torchvision ImageFolder"]
    out = []
    for name, s in samples.items():
        ratios = [a["per_core"] / b["per_core"] for a, b in zip(s, base, strict=True)]
        rates = [x["per_core"] for x in s]
        out.append({
            "photos": label, "transform": task, "system": name,
            "img/s per core": f"{statistics.median(rates):.0f}", "spread": f"{min(rates):.0f}-{max(rates):.0f}",
            "x torchvision": f"{statistics.median(ratios):.2f}",
            "wall img/s": f"{statistics.median(x['wall'] for x in s):.0f}",
            "others' cores": f"{statistics.median(x['others'] for x in s):.2f}",
            "samples": str(len(s)), "source": what,
        })
    return out


def cores_needed(records: list[dict], mfu: float = 0.5) -> list[dict]:
    """For each device of vitlab.bench.machine.GPU_PEAKS: ViT-B/16's training rate at `mfu`, and
    the cores of each pipeline it takes to feed it."""
    from vitlab.bench.machine import GPU_PEAKS
    from vitlab.checkpoints.peers import variant_config
    from vitlab.config import model_flops

    per_image = 3 * model_flops(variant_config("ViT-B/16"))
    rates = {r["system"]: float(r["img/s per core"]) for r in records if r["photos"] == "500x375" and r["transform"] == "train"}
    fast = next(v for k, v in rates.items() if k.startswith("vitlab.transform(model, train=True)"))
    out = []
    for name, peaks in GPU_PEAKS:
        if "bf16" not in peaks:
            continue
        step = peaks["bf16"] * 1e12 * mfu / per_image
        out.append({"device": name, "ViT-B/16 training img/s at 50% MFU": f"{step:,.0f}",
                    "cores, vitlab (data.decode=fast)": f"{step / fast:.1f}",
                    "cores, torchvision ImageFolder": f"{step / rates['torchvision ImageFolder']:.1f}",
                    "cores, timm create_loader": f"{step / rates['timm create_loader']:.1f}"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="fewer images, 500x375 only")
    ap.add_argument("--contended", type=float, default=0.1)
    ap.add_argument("--max-wait", type=float, default=5.0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--gpu", action="store_true", help="also data.decode=cuda on the GPU; writes pipeline-gpu.md")
    ap.add_argument("--batch", type=int, default=128, help="--gpu: images decoded on the device at a time (default 128)")
    args = ap.parse_args()
    if args.gpu:
        torch.set_num_threads(1)
        with tempfile.TemporaryDirectory() as tmp:
            what = make_photos(Path(tmp), (500, 375), 3)
            records = gpu_rows(sorted(Path(tmp).rglob("*.jpg")), args.rounds, batch=args.batch)
        columns = ["photos", "transform", "system", "img/s per core", "wall img/s", "samples"]
        tables.write_table(args.out, "pipeline-gpu", "The GPU data path (data.decode=cuda)", machine.machine_info("cuda"),
                           records, columns, f"Photographs: {what}.\n")
        print(tables.table(records, columns))
        return
    profiles: dict[str, list[dict]] = {}
    records = run(args, profiles)
    info = machine.machine_info()
    info["threads"] = "1"
    notes = (f"One thread, num_workers=0, timed by its own CPU time (images per second per core); {args.rounds} "
             "interleaved rounds, ratios to torchvision ImageFolder taken within each round. \"others' cores\" is "
             "what other processes used while a sample ran (the machine is shared).\n")
    columns = ["photos", "transform", "system", "img/s per core", "spread", "x torchvision", "wall img/s",
               "others' cores", "samples"]
    tables.write_table(args.out, "pipeline", "The input pipeline per core, beside torchvision, timm and decoding alone",
                       info, records, columns, notes + f"Photographs: {records[0]['source']}" +
                       (f"; {records[-1]['source']}" if records[-1]["source"] != records[0]["source"] else "") + ".\n")
    cores = cores_needed(records)
    atomic_write_text(Path(args.out) / "pipeline-cores.md",
                      "# Cores of decoding a ViT-B/16 at 224 needs for training\n\n" + tables.header(info) + "\n\n" +
                      "The training step's rate at 50% MFU of each device's bf16 peak (3 x the forward FLOPs of "
                      "vitlab.config.model_flops per image), over the per-core rates measured in pipeline.md "
                      "(500x375 photographs, training transform). Arithmetic, not a measurement on the device.\n\n" +
                      tables.table(cores, list(cores[0])))
    lines = [f"# Where the fast training transform's time goes\n\n{tables.header(info)}\n\nEach stage of vitlab's "
             "data.decode=fast training transform timed by the thread's CPU time, in the same run as pipeline.md "
             "(the loader's batching and the trainer's normalisation not included).\n"]
    for label, rows in profiles.items():
        lines.append(f"\n## {label}\n\n" + tables.table(rows, ["stage", "ms per image", "share"]))
    atomic_write_text(Path(args.out) / "pipeline-profile.md", "".join(lines))
    print(tables.table(records, columns))


if __name__ == "__main__":
    main()
