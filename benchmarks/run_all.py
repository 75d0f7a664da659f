"""Regenerate benchmarks/results/: throughput against the peers, serving accuracy, training.

    python benchmarks/run_all.py            # full: about 20 minutes on 2 quiet cores
    python benchmarks/run_all.py --quick    # about 6 minutes

Writes, in --out (default benchmarks/results/):
  throughput.csv / .md   `vitlab bench --suite full|quick`: vitlab beside timm, Hugging Face
                          and torchvision, interleaved, with the matmul ceilings
  serving.csv / .md      fp32, bf16 and int8 copies of the trained CIFAR-10 model on the real
                          test set: accuracy, top-1 agreement with fp32, largest logit change
  training.csv / .md     the CIFAR-sized training step: loss curves of vitlab fp32, vitlab bf16
                          autocast and timm fp32 from the same weights on the same real batches,
                          and the data pipeline's images/s beside the step's
Each Markdown file starts with the date, machine and library versions.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from safetensors.torch import load_file

import vitlab
from vitlab.bench import machine, report, runner, suites
from vitlab.checkpoints.timm import create_timm_model
from vitlab.data import make_loader, open_dataset
from vitlab.deploy import serving

ROOT = Path(__file__).resolve().parents[1]
CIFAR = ROOT.parent / "shared" / "data" / "cifar10"
CHECKPOINT = ROOT / "runs" / "cifar10" / "checkpoints" / "last.safetensors"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write(out: Path, name: str, title: str, info: dict, rows: list[dict], columns: list[str], notes: str = "") -> None:
    report.write_table(out, name, title, info, rows, columns, notes)
    log(f"wrote {out / name}.csv and .md")


def cifar(split: str, n: int, image_size: int, mean, std, train: bool = False, batch: int = 256):
    """The first n images of a real CIFAR-10 split, as (images, labels) tensors."""
    data = open_dataset(f"wds:{CIFAR}", split, image_size=image_size, mean=mean, std=std, train=train, seed=0)
    xs, ys = [], []
    for x, y, _ in itertools.islice(make_loader(data, batch, train=train, seed=0), (n + batch - 1) // batch):
        xs.append(x)
        ys.append(y)
    return torch.cat(xs)[:n], torch.cat(ys)[:n]


# Serving accuracy ------------------------------------------------------------------------
def serving_accuracy(out: Path, info: dict, checkpoint: Path, n: int) -> None:
    if not checkpoint.exists():
        log(f"serving: no trained checkpoint at {checkpoint}; skipped")
        return
    model = vitlab.load(checkpoint).eval()
    cfg = model.config
    images, labels = cifar("test", n, cfg.image_size[0], cfg.mean, cfg.std)
    rows = []
    with torch.inference_mode():
        ref = torch.cat([model(images[i : i + 500]) for i in range(0, len(images), 500)])
    for precision in serving.PRECISIONS:
        m = serving.for_precision(model, precision)
        t0 = time.perf_counter()
        with torch.inference_mode():
            logits = torch.cat([m(images[i : i + 500]).float() for i in range(0, len(images), 500)])
        seconds = time.perf_counter() - t0
        rows.append({
            "precision": precision,
            "images": len(images),
            "top1_accuracy": f"{(logits.argmax(1) == labels).float().mean().item():.4f}",
            "top1_agreement_with_fp32": f"{(logits.argmax(1) == ref.argmax(1)).float().mean().item():.4f}",
            "max_abs_logit_diff": f"{(logits - ref).abs().max().item():.3g}",
            "images_per_s_b500": f"{len(images) / seconds:.0f}",
        })
        log(f"serving {precision}: {rows[-1]}")
    notes = (f"Model: {checkpoint.relative_to(ROOT) if checkpoint.is_relative_to(ROOT) else checkpoint} "
             f"({cfg.name}, {cfg.image_size[0]}px), the real CIFAR-10 test set (JPEG shards of "
             f"/work/shared/data/cifar10). Throughput here is one pass in batches of 500, not an "
             f"interleaved benchmark.\n")
    write(out, "serving", "bf16 and int8 serving: accuracy against fp32", info, rows,
          list(rows[0]), notes)


# Training --------------------------------------------------------------------------------
TRAINING_SYSTEMS = {"vitlab fp32": False, "vitlab bf16-autocast": True, "timm fp32": False, "timm bf16-autocast": True}


def same_start(cfg) -> dict[str, torch.nn.Module]:
    """vitlab and timm models with the same initial weights (timm's through vitlab's converter)."""
    torch.manual_seed(0)
    init = vitlab.create_model(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        vitlab.save(init, Path(tmp) / "init.safetensors", format="timm")
        timm_state = load_file(str(Path(tmp) / "init.safetensors"))
    models = {}
    for name in TRAINING_SYSTEMS:
        if name.startswith("timm"):
            m = create_timm_model(init.config)
            m.load_state_dict(timm_state)
        else:
            m = vitlab.create_model(init.config)
            m.load_state_dict(init.state_dict())
        models[name] = m.train()
    return models


def loss_curves(models: dict, images, labels, steps: int, batch: int):
    """Train each model on the same batches: (losses, step seconds, others' CPU per step)."""
    losses: dict[str, list[float]] = {}
    seconds: dict[str, list[float]] = {}
    busy = []  # other processes' CPU use (cores) during each step
    for name, autocast in TRAINING_SYSTEMS.items():
        m = models[name]
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.05)
        losses[name], seconds[name] = [], []
        for s in range(steps):
            x, y = images[s * batch : (s + 1) * batch], labels[s * batch : (s + 1) * batch]
            machine.wait_quiet(0.1, 0.5)
            with machine.CpuMeter() as meter:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    loss = F.cross_entropy(m(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            seconds[name].append(meter.wall)
            busy.append(meter.others)
            losses[name].append(loss.item())
        log(f"training {name}: loss {losses[name][0]:.3f} -> {losses[name][-1]:.3f}")
    return losses, seconds, busy


def data_pipeline_rates(cfg, batch: int) -> list[dict]:
    """The data pipeline alone: decode + inception crop + flip of the training shards."""
    rows = []
    for workers in (0, 2):
        data = open_dataset(f"wds:{CIFAR}", "train", image_size=32, mean=cfg.mean, std=cfg.std, train=True, seed=1)
        it = iter(make_loader(data, batch, train=True, seed=1, num_workers=workers))
        next(it)  # start-up (workers, first shard) is not throughput
        t0, n = time.perf_counter(), 0
        for x, _, _ in itertools.islice(it, 12):
            n += len(x)
        rate = n / (time.perf_counter() - t0)
        rows.append({"system": f"data pipeline, {workers} workers", "images_per_s_median_step": f"{rate:.0f}"})
        log(f"data pipeline with {workers} workers: {rate:.0f} images/s")
    return rows


def training(out: Path, info: dict, steps: int, batch: int = 128) -> None:
    cfg = vitlab.get_config("ViT-C/4")
    images, labels = cifar("train", steps * batch, 32, cfg.mean, cfg.std, train=True, batch=batch)
    log(f"training: {steps} steps of {batch} real CIFAR-10 training images, {len(TRAINING_SYSTEMS)} systems")
    losses, seconds, busy = loss_curves(same_start(cfg), images, labels, steps, batch)
    rows = []
    timm_rate = batch / statistics.median(seconds["timm fp32"][1:])
    ref = losses["vitlab fp32"]
    for name in TRAINING_SYSTEMS:
        rate = batch / statistics.median(seconds[name][1:])
        tail = losses[name][-max(steps // 4, 1):]
        rows.append({
            "system": name,
            "steps": steps,
            "first_loss": f"{losses[name][0]:.4f}",
            "last_quarter_mean_loss": f"{statistics.fmean(tail):.4f}",
            "max_abs_loss_diff_vs_vitlab_fp32": f"{max(abs(a - b) for a, b in zip(losses[name], ref)):.4f}",
            "images_per_s_median_step": f"{rate:.1f}",
            "x_timm_fp32": f"{rate / timm_rate:.2f}",
        })
    curves = "| step | " + " | ".join(TRAINING_SYSTEMS) + " |\n|" + " --- |" * (len(TRAINING_SYSTEMS) + 1) + "\n"
    for s in range(0, steps, max(steps // 10, 1)):
        curves += f"| {s} | " + " | ".join(f"{losses[n][s]:.4f}" for n in TRAINING_SYSTEMS) + " |\n"
    contended = sum(b > 0.1 for b in busy)
    notes = ("ViT-C/4 (D 192, depth 9, patch 4, 32 px), batch 128, AdamW lr 1e-3, the same initial "
             "weights (timm's copied with vitlab's timm converter) and the same real augmented batches "
             "for every system; step times are wall-clock medians after the first step, each step "
             f"started on a quiet machine where possible: {contended} of {len(busy)} steps ran while "
             f"other processes used more than 0.1 cores (mean {statistics.fmean(busy):.2f} cores); "
             "the interleaved figures are in throughput.md. Data rows: decoding and augmenting only, "
             "no model.\n\n"
             "Loss curves:\n\n" + curves + "\n")
    rows += data_pipeline_rates(cfg, batch)
    write(out, "training", "Training step on the CIFAR-sized ViT", info, rows, list(rows[0]), notes)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the quick suite and fewer images and steps")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--checkpoint", default=str(CHECKPOINT), help="trained model for the serving accuracy")
    p.add_argument("--only", nargs="+", choices=("throughput", "serving", "training"),
                   default=["throughput", "serving", "training"])
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine.machine_info()
    t0 = time.perf_counter()
    if "serving" in args.only:
        serving_accuracy(out, info, Path(args.checkpoint), 2000 if args.quick else 10000)
    if "training" in args.only:
        training(out, info, 10 if args.quick else 30)
    if "throughput" in args.only:
        name = "quick" if args.quick else "full"
        config = runner.BenchConfig(rounds=2 if args.quick else 3, min_time=0.5 if args.quick else 1.0)
        rows = runner.run(suites.suite(name), config, log=log,
                          progress=lambda rows: report.write_results(rows, out, "throughput", info, config))
        log(f"wrote {out / 'throughput'}.csv and .md")
    log(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
