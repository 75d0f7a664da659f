"""The reports of the GPU check (benchmarks/gpu.sh): the user's commands, and the GPU goals.

    python benchmarks/gpu_report.py prepare --data CIFAR_DIR --per-class N --out DIR
    python benchmarks/gpu_report.py report --work WORK --out OUT --seconds S [--smoke]

`prepare` checks that torch sees a CUDA device (naming it), then writes the first N CIFAR-10
test JPEGs of each class as an image folder (DIR/test/CLASS/*.jpg, and DIR/train/ beside it, so
that `--data imagefolder:DIR --split test` reads them) for `predict` and the smoke run's `eval`.

`report` writes OUT/gpu-commands.md (each command of gpu.sh: exit status, seconds, what it
gave) and OUT/gpu-goals.md: the GPU goals of docs/performance.md read from gpu.csv (`vitlab
bench --suite gpu`) and pipeline-gpu.csv (the nvjpeg path) of the same run, vitlab beside timm
measured in the same rounds, and, for each goal that falls short, where the time goes: a
torch.profiler summary of that computation (the operators with the most device time).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

import report_tables as tables  # noqa: E402  (this folder's module: the script's folder is on sys.path)
from vitlab.bench import machine
from vitlab.files import atomic_write_text

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
EIGHT_MINUTES = 480.0  # gpu.sh's budget on an H100-class GPU


# prepare ------------------------------------------------------------------------------------
def write_images(data: Path, per_class: int, out: Path) -> int:
    """The first `per_class` CIFAR-10 test JPEGs of each class as an image folder."""
    from vitlab.data.tar_shards import iter_shard

    if out.exists():
        shutil.rmtree(out)
    taken = dict.fromkeys(CLASSES, 0)
    for shard in sorted(data.glob("test-*.tar*")):
        for key, parts in iter_shard(shard):
            name = CLASSES[int(parts["cls"].decode())]
            if "jpg" not in parts or taken[name] == per_class:
                continue
            for split in ("test", "train"):
                (out / split / name).mkdir(parents=True, exist_ok=True)
                (out / split / name / f"{Path(key).name}.jpg").write_bytes(parts["jpg"])
            taken[name] += 1
            if min(taken.values()) == per_class:
                return sum(taken.values())
    return sum(taken.values())


# The commands -------------------------------------------------------------------------------
def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def last_line(log: Path, contains: str = "") -> str:
    try:
        lines = [x.strip() for x in log.read_text().splitlines() if x.strip() and contains in x]
    except OSError:
        return ""
    return lines[-1][:160] if lines else ""


def run_result(log: Path, folder: Path) -> str:
    """What a training run gave: the steps it took and how long (its log's last "done:"
    line, written at the end of each command), test top-1 where it evaluated."""
    text = last_line(log, "done:").removeprefix("done: ")
    test = read_json(folder / "summary.json").get("splits", {})
    top1 = test.get("test", {}).get("top1") if isinstance(test, dict) else None
    return text + (f", test top-1 {100 * top1:.2f}%" if top1 is not None else "")


def command_result(name: str, work: Path, out: Path) -> str:
    log = work / "logs" / f"{name}.log"
    runs = {"train-bf16": "bf16", "train-fp16": "fp16", "resume-fp16": "fp16", "torchrun": "torchrun", "finetune": "finetune"}
    if name in runs:
        return run_result(log, work / runs[name])
    if name == "eval":
        top1 = read_json(work / "eval" / "eval-test.json").get("top1")
        return f"test top-1 {100 * top1:.2f}%" if top1 is not None else last_line(log)
    if name == "predict":
        rows = list(csv.DictReader((work / "predict.csv").open())) if (work / "predict.csv").exists() else []
        return f"{len(rows)} images classified, {len(list((work / 'overlays').glob('*.png')))} attention overlays"
    if name.startswith("export"):
        return last_line(log, "checked")
    if name == "prepare":
        return last_line(log, "the device:") + f"; {len(list((work / 'images' / 'test').rglob('*.jpg')))} CIFAR-10 test JPEGs"
    if name == "bench":
        return f"{len(read_csv(out / 'gpu.csv'))} rows in gpu.md"
    if name == "pipeline":
        rows = [r for r in read_csv(out / "pipeline-gpu.csv") if r.get("wall img/s")]
        return f"{rows[0]['wall img/s']} img/s on the device" if rows else ""
    return last_line(log)


def commands_page(work: Path, out: Path, seconds: float, smoke: bool, info: dict[str, str]) -> str:
    rows = []
    for line in (work / "commands.tsv").read_text().splitlines():
        name, code, took, command = line.split("\t", 3)
        rows.append({"step": name, "exit": code, "seconds": took, "result": command_result(name, work, out),
                     "command": f"`{command.replace(str(work), 'WORK')}`"})
    failed = [r["step"] for r in rows if r["exit"] != "0"]
    verdict = f"{len(rows) - len(failed)} of {len(rows)} steps succeeded" + (f"; failed: {', '.join(failed)}" if failed else "")
    budget = "" if smoke else f" ({'within' if seconds <= EIGHT_MINUTES else 'over'} its 8-minute budget)"
    notes = [*([SMOKE, ""] if smoke else []), f"{verdict}. The whole script took {seconds:.0f} s{budget}.", ""]
    return (f"# The GPU check: the user's commands (benchmarks/gpu.sh)\n\n{tables.header(info)}\n\n" + "\n".join(notes)
            + "\n" + tables.table(rows, ["step", "exit", "seconds", "result", "command"]))


SMOKE = ("**A smoke run**: a CPU played the GPU (tests/fake_gpu.py) at tiny sizes, to show that the script's "
         "commands and this writer run. Its figures say nothing about any GPU.")


# The goals ----------------------------------------------------------------------------------
def read_csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open())) if path.exists() else []


def number(text: Optional[str]) -> Optional[float]:
    try:
        return float(text) if text else None
    except ValueError:
        return None


@dataclass
class Goal:
    name: str
    target: str
    measured: str
    met: Optional[bool]  # None: not measured
    profile: str = ""  # which computation explains a shortfall: "train", "infer" or "data"


def best(rows: list[dict[str, str]], key: str = "images_per_s") -> Optional[dict[str, str]]:
    rated = [r for r in rows if number(r.get(key)) is not None]
    return max(rated, key=lambda r: number(r[key])) if rated else None


def label(r: dict[str, str]) -> str:
    return f"{r['impl']} {r['precision']}" + (f" compiled ({r['compiled']})" if r.get("compiled") else "")


def goals(bench: list[dict[str, str]], pipeline: list[dict[str, str]]) -> list[Goal]:
    """The GPU goals from the bench rows (gpu.csv) and the data path's (pipeline-gpu.csv)."""
    train = [r for r in bench if r["task"] == "train"]
    batch = max((int(r["batch"]) for r in train), default=0)
    ours = best([r for r in train if r["impl"] == "vitlab" and r["precision"] == "bf16-autocast"])
    theirs = best([r for r in train if r["impl"] == "timm" and r["precision"] == "bf16-autocast"])
    mfu = best([r for r in train if r["impl"] == "vitlab" and r["precision"] == "bf16-autocast"], "mfu_pct")
    model = train[0]["model"] if train else "the model"
    out = []
    if mfu:
        value = number(mfu["mfu_pct"])
        out.append(Goal(f"{model} bf16 training step, batch {batch}: MFU", ">= 50%", f"{value:.1f}% ({label(mfu)})",
                        value >= 50, "train"))
    else:
        out.append(Goal(f"{model} bf16 training step: MFU", ">= 50%", "not measured (no peak known for this device)", None))
    out.append(ratio_goal(f"{model} bf16 training step, batch {batch}: img/s against timm's", ours, theirs, 1.2, "train"))
    infer = [r for r in bench if r["task"] == "infer"]
    big = max((int(r["batch"]) for r in infer), default=0)
    at = [r for r in infer if int(r["batch"]) == big]
    ours_i = best([r for r in at if r["impl"] == "vitlab" and r["precision"] == "bf16"])
    theirs_i = best([r for r in at if r["impl"] == "timm" and r["precision"] in ("bf16", "bf16-autocast")])
    out.append(ratio_goal(f"{model} bf16 inference, batch {big}: img/s against timm's", ours_i, theirs_i, 1.2, "infer"))
    device = next((number(r.get("wall img/s")) for r in pipeline if r.get("wall img/s")), None)
    step = number(ours["images_per_s"]) if ours else None
    if device is not None and step:
        out.append(Goal("the nvjpeg data path (decode, crop, resize, flip, normalise on the device) against the "
                        "training step it feeds", "> 1x", f"{device:,.0f} against {step:,.0f} img/s = {device / step:.2f}x",
                        device > step, "data"))
    else:
        out.append(Goal("the nvjpeg data path against the training step it feeds", "> 1x", "not measured", None))
    return out


def ratio_goal(name: str, ours: Optional[dict], theirs: Optional[dict], target: float, profile: str) -> Goal:
    a, b = (number(ours["images_per_s"]) if ours else None), (number(theirs["images_per_s"]) if theirs else None)
    if not a or not b:
        return Goal(name, f">= {target}x", "not measured", None)
    return Goal(name, f">= {target}x", f"{a:,.1f} ({label(ours)}) against {b:,.1f} ({label(theirs)}) = {a / b:.2f}x",
                a / b >= target, profile)


# Where the time goes ------------------------------------------------------------------------
def profile_rows(fn: Callable[[], object], device: str, steps: int = 3) -> tuple[list[dict], str]:
    """The operators with the most self time over `steps` calls of `fn` (device time where
    the profiler sees the GPU, else CPU time), and which time that is."""
    from torch.profiler import ProfilerActivity, profile, supported_activities

    on_device = ProfilerActivity.CUDA in supported_activities()
    sync = machine.device_sync(device)
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_device else [])]) as prof:
        for _ in range(steps):
            fn()
        sync()
    events = list(prof.key_averages())
    key = "self_device_time_total" if on_device else "self_cpu_time_total"
    total = sum(getattr(e, key) for e in events) or 1.0
    top = sorted(events, key=lambda e: -getattr(e, key))[:12]
    rows = [{"operator": e.key[:70], "calls per step": f"{e.count / steps:g}", "ms per step": f"{getattr(e, key) / 1e3 / steps:.2f}",
             "share": f"{getattr(e, key) / total:.0%}"} for e in top]
    return rows, "device" if on_device else "CPU"


def profiled(kind: str, bench: list[dict[str, str]], device: str) -> Callable[[], object]:
    """The computation behind a goal: vitlab's bf16 training step or bf16 inference at the
    run's model and largest batch, or the device's decode of a batch of 128 photographs."""
    from vitlab.bench.suites import setting
    from vitlab.bench.systems import System, prepare

    if kind == "data":
        import tempfile

        import pipeline
        from vitlab.data import decode as D
        from vitlab.data.datasets import Encoded
        from vitlab.data.transforms import train_transform

        with tempfile.TemporaryDirectory() as tmp:
            pipeline.make_photos(Path(tmp), (500, 375), 3)
            plan = train_transform(224, pipeline.MEAN, pipeline.STD, decode="cuda")
            encoded = [Encoded(f, str(f)) for f in sorted(Path(tmp).rglob("*.jpg"))]
            planned = [plan(e) for e in (encoded * (128 // len(encoded) + 1))[:128]]
        return lambda: D.decode_planned(planned, (224, 224), device, (pipeline.MEAN, pipeline.STD))
    rows = [r for r in bench if r["task"] == kind]
    batch = max(int(r["batch"]) for r in rows)
    system = System("vitlab", "bf16-autocast" if kind == "train" else "bf16")
    return prepare(setting(rows[0]["model"], batch, kind), system, device=device).fn


def goals_page(found: list[Goal], bench: list[dict[str, str]], device: str, smoke: bool, info: dict[str, str]) -> str:
    def verdict(g: Goal) -> str:
        return "not measured" if g.met is None else ("met" if g.met else "**short**")

    rows = [{"goal": g.name, "target": g.target, "measured": g.measured, "": verdict(g)} for g in found]
    parts = [f"# The GPU goals (benchmarks/gpu.sh)\n\n{tables.header(info)}\n", *([SMOKE, ""] if smoke else []),
             "vitlab and timm in the same run: `vitlab bench --suite gpu` (gpu.md) and the data path "
             "(pipeline-gpu.md). MFU is the model's nominal FLOPs times images per second over the device's "
             "data-sheet peak (vitlab.bench.machine.GPU_PEAKS).\n", tables.table(rows, ["goal", "target", "measured", ""])]
    for kind in dict.fromkeys(g.profile for g in found if g.met is False and g.profile):
        what = {"train": "the bf16 training step", "infer": "bf16 inference", "data": "the nvjpeg data path (128 images)"}[kind]
        try:
            rows, clock = profile_rows(profiled(kind, bench, device), device)
        except Exception as e:  # a profile that cannot run is reported, not fatal: the goals stand
            parts.append(f"\n## Where the time goes: {what}\n\nthe profile failed: {type(e).__name__}: {e}\n")
            continue
        parts.append(f"\n## Where the time goes: {what}\n\ntorch.profiler, 3 calls after a warm-up; self {clock} time "
                     f"per operator, the 12 largest:\n\n" + tables.table(rows, ["operator", "calls per step", "ms per step", "share"]))
    return "\n".join(parts) + "\n"


def report(work: Path, out: Path, seconds: float, smoke: bool) -> None:
    device = "cuda"
    info = machine.machine_info(device) if torch.cuda.is_available() else machine.machine_info()
    info["date"] = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    atomic_write_text(out / "gpu-commands.md", commands_page(work, out, seconds, smoke, info))
    bench = read_csv(out / "gpu.csv")
    found = goals(bench, read_csv(out / "pipeline-gpu.csv"))
    atomic_write_text(out / "gpu-goals.md", goals_page(found, bench, device, smoke, info))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    prepare = sub.add_parser("prepare", help="check the GPU; CIFAR-10 test JPEGs as an image folder")
    prepare.add_argument("--data", type=Path, required=True)
    prepare.add_argument("--per-class", type=int, default=8)
    prepare.add_argument("--out", type=Path, required=True)
    rep = sub.add_parser("report", help="gpu-commands.md and gpu-goals.md")
    rep.add_argument("--work", type=Path, required=True)
    rep.add_argument("--out", type=Path, required=True)
    rep.add_argument("--seconds", type=float, required=True, help="how long gpu.sh ran")
    rep.add_argument("--smoke", action="store_true", help="a smoke run (a CPU playing the GPU): say so on the pages")
    args = ap.parse_args()
    if args.what == "prepare":
        if not torch.cuda.is_available():
            print("gpu_report.py: torch sees no CUDA device here; run benchmarks/gpu.sh on a GPU machine", file=sys.stderr)
            return 1
        print(f"the device: {torch.cuda.get_device_name()}")
        n = write_images(args.data, args.per_class, args.out)
        print(f"{n} CIFAR-10 test JPEGs in {args.out}")
        return 0 if n == args.per_class * len(CLASSES) else 1
    report(args.work, args.out, args.seconds, args.smoke)
    print(f"wrote {args.out / 'gpu-commands.md'} and {args.out / 'gpu-goals.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
