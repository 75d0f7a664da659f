"""What a run tells its user: metrics.jsonl, TensorBoard events, a progress bar or plain
log lines, and the learning-curve PNG. Only rank 0 builds one of these."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Optional, TextIO

from vitlab.analysis import plots
from vitlab.files import atomic_write_text


class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl (and TensorBoard when installed)."""

    def __init__(self, folder: Path, tensorboard: bool = True):
        self.path = folder / "metrics.jsonl"
        self.file = open(self.path, "a", buffering=1)
        self.writer = None
        self.tb_note = ""
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(folder / "tensorboard"))
            except Exception:  # tensorboard missing or broken: the JSON lines are enough
                self.tb_note = "tensorboard is not installed: no event files (pip install tensorboard)"

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        if self.writer is not None:
            split, step = record.get("split", "train"), record["step"]
            for k, v in record.items():
                if k not in ("step", "split", "epoch") and isinstance(v, (int, float)) and math.isfinite(v):
                    self.writer.add_scalar(f"{split}/{k}", v, step)

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()


def truncate_after(path: Path, step: int) -> None:
    """Drop metrics lines written after `step` (by a run killed before its next checkpoint),
    so a resumed run's metrics.jsonl reads as if it had never stopped."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= step]
    atomic_write_text(path, "".join(line + "\n" for line in keep))


class Progress:
    """A one-line bar (throughput, loss, ETA) on a terminal; plain lines every `log_every`
    steps elsewhere (a log file, CI)."""

    def __init__(self, total: int, start: int = 0, stream: TextIO = sys.stderr, tty: Optional[bool] = None):
        self.total, self.start = total, start
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.t0 = time.perf_counter()

    def update(self, step: int, loss: float, lr: float, images_per_s: float, log_line: bool) -> None:
        done = step - self.start
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / max(done, 1) * (self.total - step)
        text = f"step {step}/{self.total}  loss {loss:.4f}  lr {lr:.2e}  {images_per_s:,.0f} img/s  ETA {_fmt(eta)}"
        if self.tty:
            width = 24
            filled = int(width * step / max(self.total, 1))
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}\033[K")
            self.stream.flush()
        elif log_line:
            print(text, file=self.stream, flush=True)

    def message(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _fmt(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else f"{seconds // 60}:{seconds % 60:02d}"


def plot_run(folder, results: dict[str, dict[str, Any]], class_names: list[str]) -> list[str]:
    """The run's figures: the learning curve and a confusion matrix per split. Returns notes
    for what could not be drawn (matplotlib is an optional extra)."""
    note = plot_learning_curve(folder.metrics, folder.path / "learning_curve.png")
    if note:
        return [note]
    for split, m in results.items():
        if "confusion" in m:
            plots.plot_confusion(m["confusion"], class_names, folder.path / f"confusion_{split}.png")
    return []


def final_report(folder, summary: dict[str, Any], results: dict[str, dict[str, Any]], notes: list[str]) -> str:
    """What `vitlab train` prints at the end: the results, then where every output is."""
    lines = [f"done: {summary['steps']} steps in {summary['train_seconds']:.1f} s"]
    for split, m in results.items():
        if "top1" in m:
            lines.append(f"  {split}: top-1 {m['top1']:.2%}  top-5 {m['top5']:.2%}  loss {m['loss']:.4f}")
    if summary["bad_images_skipped"]:
        lines.append(f"  skipped {summary['bad_images_skipped']} unreadable images (--skip-bad-images)")
    out = folder.path
    lines += [
        f"outputs in {out}/:",
        f"  checkpoint      {summary['checkpoint']}",
        f"  summary         {folder.summary}",
        f"  metrics         {folder.metrics}",
        f"  config          {folder.config}",
    ]
    if (out / "learning_curve.png").exists():
        lines.append(f"  learning curve  {out / 'learning_curve.png'}")
    if (out / "tensorboard").exists():
        lines.append(f"  tensorboard     tensorboard --logdir {out / 'tensorboard'}")
    return "\n".join(lines + [f"  note: {n}" for n in notes])


def plot_learning_curve(metrics_path: Path, out: Path) -> Optional[str]:
    """Loss and accuracy against step, train and evaluation splits. Returns a note instead of
    writing the file when matplotlib is missing."""
    series: dict[str, dict[str, list]] = {}
    for line in metrics_path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        s = series.setdefault(r.get("split", "train"), {"step": [], "loss": [], "accuracy": []})
        s["step"].append(r["step"])
        s["loss"].append(r.get("loss", float("nan")))
        s["accuracy"].append(r.get("accuracy", r.get("top1", float("nan"))))
    try:
        plots.plot_learning_curve(series, out)
    except ImportError:
        return "matplotlib is not installed: no learning-curve PNG (pip install matplotlib)"
    return None
