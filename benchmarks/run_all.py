"""Regenerate benchmarks/results/: every table the performance goals are read from.

    python benchmarks/run_all.py              # everything: about an hour on 2 quiet cores
    python benchmarks/run_all.py --quick      # about 20 minutes
    python benchmarks/run_all.py --only throughput --clock cpu   # one section, busy machine

Writes, in --out (default benchmarks/results/):
  end-to-end.md/.csv   `vitlab train` (benchmarks/train-c4-bf16.yaml) beside its bare step,
                       measured before and after the run
  serving.md/.csv      fp32, bf16 and int8 copies of the end-to-end run's model on the real
                       CIFAR-10 test set: accuracy, top-1 agreement with fp32, logit change
  training.md/.csv     the CIFAR-sized training step: loss curves of vitlab and timm from the
                       same weights on the same real batches, and the data pipeline's rate
  profiles.md          where the time goes: CPU-time profiles by kind of work
  scaling.md/.csv      `vitlab bench --suite scaling`; scaling-summary.md, docs/figures/scaling.png
  throughput.md/.csv   `vitlab bench --suite full|quick`: vitlab beside timm, Hugging Face
                       and torchvision, interleaved, with the matmul ceilings
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

import report_tables as tables  # noqa: E402  (this folder's module: the script's folder is on sys.path)
import vitlab
from endtoend import end_to_end  # noqa: E402 (this folder's modules; the script's folder is on sys.path)
from profiles import profiles
from scaling import scaling
from vitlab.bench import machine, runner, suites
from vitlab.checkpoints.timm import create_timm_model
from vitlab.data import make_loader, open_dataset
from vitlab.data.transforms import model_transform
from vitlab.deploy import copies

ROOT = Path(__file__).resolve().parents[1]
CIFAR = ROOT.parent / "shared" / "data" / "cifar10"
CHECKPOINT = ROOT / "runs" / "c4-bf16-t1w1" / "checkpoints" / "last.safetensors"  # from the end-to-end run


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write(out: Path, name: str, title: str, info: dict, rows: list[dict], columns: list[str], notes: str = "") -> None:
    tables.write_table(out, name, title, info, rows, columns, notes)
    log(f"wrote {out / name}.csv and .md")


def cifar(split: str, n: int, cfg, train: bool = False, batch: int = 256):
    """The first n images of a real CIFAR-10 split, as (images, labels) tensors."""
    transform = model_transform(cfg, train=train)  # the model's own preprocessing, as every vitlab command
    data = open_dataset(f"wds:{CIFAR}", split, transform, train=train, seed=0)
    xs, ys = [], []
    for x, y, _ in itertools.islice(make_loader(data, batch, train=train, seed=0), (n + batch - 1) // batch):
        xs.append(x)
        ys.append(y)
    return torch.cat(xs)[:n], torch.cat(ys)[:n]


# Serving accuracy ------------------------------------------------------------------------
SERVING = {  # name -> (precision, calibrated)
    "fp32": ("fp32", False), "fp32-packed": ("fp32-packed", False), "bf16": ("bf16", False),
    "int8 (calibrated, oneDNN)": ("int8", True), "int8 (per-token, _int_mm)": ("int8", False),
}


def serving_accuracy(out: Path, info: dict, checkpoint: Path, n: int, calibration_images: int = 512) -> None:
    if not checkpoint.exists():
        log(f"serving: no trained checkpoint at {checkpoint}; skipped")
        return
    model = vitlab.load(checkpoint).eval()
    cfg = model.config
    images, labels = cifar("test", n, cfg)
    calibration, _ = cifar("train", calibration_images, cfg)
    rows = []
    with torch.inference_mode():
        ref = torch.cat([model(images[i : i + 500]) for i in range(0, len(images), 500)])
    for name, (precision, calibrated) in SERVING.items():
        m = copies.for_precision(model, precision, calibration=calibration if calibrated else None)
        t0 = time.perf_counter()
        with torch.inference_mode():
            logits = torch.cat([m(images[i : i + 500]).float() for i in range(0, len(images), 500)])
        seconds = time.perf_counter() - t0
        rows.append({
            "precision": name,
            "images": len(images),
            "top1_accuracy": f"{(logits.argmax(1) == labels).float().mean().item():.4f}",
            "top1_agreement_with_fp32": f"{(logits.argmax(1) == ref.argmax(1)).float().mean().item():.4f}",
            "max_abs_logit_diff": f"{(logits - ref).abs().max().item():.3g}",
            "images_per_s_b500": f"{len(images) / seconds:.0f}",
        })
        log(f"serving {name}: {rows[-1]}")
    where = checkpoint.relative_to(ROOT) if checkpoint.is_relative_to(ROOT) else checkpoint
    notes = (f"Model: {where} ({cfg.name}, {cfg.image_size[0]}px), the real CIFAR-10 test set (JPEG shards of "
             f"../shared/data/cifar10). The calibrated int8 copy is calibrated on the first "
             f"{calibration_images} training images (never the test images). Throughput here is one pass "
             "in batches of 500 on a shared machine, not an interleaved benchmark.\n")
    write(out, "serving", "bf16 and int8 serving: accuracy against fp32", info, rows, list(rows[0]), notes)


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
        data = open_dataset(f"wds:{CIFAR}", "train", model_transform(cfg, train=True), train=True, seed=1)
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
    images, labels = cifar("train", steps * batch, cfg, train=True, batch=batch)
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
            "max_abs_loss_diff_vs_vitlab_fp32": f"{max(abs(a - b) for a, b in zip(losses[name], ref, strict=True)):.4f}",
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


SECTIONS = ("end-to-end", "serving", "training", "profiles", "scaling", "throughput")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the quick suite and fewer images and steps")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--checkpoint", default=str(CHECKPOINT), help="trained model for the serving accuracy")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="for the throughput and scaling tables")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine.machine_info()
    config = runner.BenchConfig(rounds=2 if args.quick else 3, min_time=0.5 if args.quick else 1.0, clock=args.clock)
    t0 = time.perf_counter()
    if "end-to-end" in args.only:
        end_to_end(out, info, f"wds:{CIFAR}", ROOT / "runs", log,
                   ((1, 1, 100 if args.quick else 0), (2, 1, 100 if args.quick else 150), (2, 0, 100 if args.quick else 150)))
    if "serving" in args.only:
        serving_accuracy(out, info, Path(args.checkpoint), 2000 if args.quick else 10000)
    if "training" in args.only:
        training(out, info, 10 if args.quick else 30)
    shares = {}
    if "profiles" in args.only:
        shares = profiles(out, info, log)
    if "scaling" in args.only:
        scaling(out, info, shares, ROOT / "docs" / "figures" / "scaling.png", log, config)
    if "throughput" in args.only:
        name = "quick" if args.quick else "full"
        runner.run(suites.suite(name), config, log=log,
                   progress=lambda rows: tables.write_results(rows, out, "throughput", info, config))
        log(f"wrote {out / 'throughput'}.csv and .md")
    log(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
