"""What a run tells its user: metrics.jsonl (and the trackers asked for with `--log`), the
progress of training and of evaluation, the figures, and the final print. Only rank 0
builds one of these.

Progress follows vitlab.progress (one behaviour for every command): tqdm's bar on a terminal;
in a log file or CI, where a bar would be a stream of carriage returns, plain lines: after
the first step, every `train.log_every` steps, and at least every 10 s.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, TextIO

from vitlab import progress
from vitlab.analysis import plots
from vitlab.config import ConfigError
from vitlab.config.model import grid_note
from vitlab.files import atomic_write_text
from vitlab.files.documents import read_json_lines
from vitlab.log import get_logger
from vitlab.run_layout import METRICS
from vitlab.train.compute import format_compute
from vitlab.train.tracking import Tracker

LOG = get_logger("train")


# What "accuracy" means in a run's metrics, per objective (the learning curve's axis label).
ACCURACY_LABELS = {"supervised": "top-1 accuracy", "mpp": "colour accuracy of corrupted patches (§4.6)"}


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite (or, in a sweep cell, diverged): the message names the
    step and the last good checkpoint."""


class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl and hands each record to the trackers."""

    def __init__(self, folder: Path, trackers: Sequence[Tracker] = ()):
        self.path = folder / METRICS
        self.file = open(self.path, "a", buffering=1)
        self.trackers = list(trackers)

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        for tracker in self.trackers:
            tracker.log(record)

    def close(self) -> None:
        self.file.close()
        for tracker in self.trackers:
            tracker.close()


def new_window() -> dict[str, float]:
    """The running sums of one log window (the steps a train record of metrics.jsonl averages):
    loss, accuracy and steps, images, start time."""
    return {"loss": 0.0, "acc": 0.0, "n": 0, "images": 0, "t": time.perf_counter()}


def summary_splits(results: dict[str, dict[str, Any]], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each evaluated split's metrics as summary.json holds them: the confusion matrix left to
    its figure, the per-class accuracies by class name."""
    splits = {}
    for split, m in results.items():
        entry = {k: v for k, v in m.items() if k != "confusion"}
        if isinstance(entry.get("per_class"), list):
            entry["per_class"] = dict(zip(names, entry["per_class"], strict=True))
        splits[split] = entry
    return splits


def truncate_after(path: Path, step: int) -> None:
    """Drop metrics lines written after `step` (by a run killed before its next checkpoint),
    so a resumed run's metrics.jsonl reads as if it had never stopped."""
    if not path.exists():
        return
    keep = [line for line in path.read_text(errors="replace").splitlines() if _step_of(line) <= step]
    atomic_write_text(path, "".join(line + "\n" for line in keep))


def _step_of(line: str) -> float:
    """The step of a metrics line; a line cut short by a crash or a full disk counts as none."""
    try:
        record = json.loads(line)
        return float(record.get("step", 0)) if isinstance(record, dict) else math.inf
    except (ValueError, TypeError, RecursionError):
        return math.inf


class Progress:
    """Training progress on vitlab.progress's one behaviour: a bar on a terminal (updated every
    step, drawn from the first step, so that the plan line comes first); plain lines
    elsewhere (a log file, CI): after the first step, on `log_line` steps, whenever EVERY_S
    seconds pass without a line, and from the watcher's heartbeat when one step takes longer
    than that (a large model on a CPU).

    `loss` is the mean over the steps since the last log line (what metrics.jsonl records as
    "loss"); `last_loss`, when given, is the latest step's own loss. Both are named so on
    the console, because the two differ by the noise of one batch.
    """

    EVERY_S = progress.Progress.EVERY_S

    def __init__(self, total: int, start: int = 0, stream: Optional[TextIO] = None, tty: Optional[bool] = None,
                 quiet: bool = False, lr: float = 0.0):
        self.total, self.start, self.quiet = total, start, quiet
        self.t0 = time.perf_counter()
        self.first = True
        self.divergence = Divergence(lr)  # watched with --quiet too: its warning goes to stderr
        self.shown = progress.Progress(total, "train", "step", initial=start, stream=stream, tty=tty, leave=True,
                                       heartbeat=self._heartbeat, quiet=quiet, own_lines=True)
        self.shown.EVERY_S = self.EVERY_S
        self.tty = self.shown.tty

    def _heartbeat(self, step: int, quiet_for: float) -> str:
        return f"step {step + 1}/{self.total} running ({progress.format_seconds(quiet_for)} since the last line)"

    def update(self, step: int, loss: float, lr: float, images_per_s: float, log_line: bool,
               last_loss: Optional[float] = None) -> None:
        warning = self.divergence.check(step, loss if last_loss is None else last_loss, lr)
        if warning and divergence_mode() == "error":
            raise TrainingDiverged(f"{warning} ({DIVERGENCE_ENV}=error: a sweep cell stops here unless its spec "
                                   "says allow_divergence: true)")
        if warning:
            LOG.warning(f"warning: {warning}")
        if self.quiet:
            return
        last = f"  last loss {last_loss:.4f}" if last_loss is not None else ""
        rate = f"{images_per_s:,.0f}" if images_per_s >= 10 else f"{images_per_s:.2g}"  # a slow step: 0.38, not 0
        numbers = f"mean loss {loss:.4f}{last}  lr {lr:.2e}  {rate} img/s"
        if self.tty:
            self.shown.moveto(step, numbers)
        else:
            self.shown.n, self.shown.moved = step, time.perf_counter()
            if log_line or self.first or self.shown.quiet_for() >= self.EVERY_S:
                eta = (time.perf_counter() - self.t0) / max(step - self.start, 1) * (self.total - step)
                self.shown.write(f"step {step}/{self.total}  {numbers}  ETA {progress.format_seconds(eta)}")
        self.first = False

    def message(self, text: str) -> None:
        """A line of its own (an evaluation result, a note) that leaves the bar intact."""
        if not self.quiet:
            self.shown.write(text)

    def close(self) -> None:
        self.shown.close()


DIVERGENCE_ENV = "VITLAB_DIVERGENCE"  # "warn" (the default) or "error": a sweep sets it for its cells' steps


def divergence_mode() -> str:
    """What a diverging loss does: "warn" (say so once, go on) or "error" (stop the run, status 3)."""
    mode = os.environ.get(DIVERGENCE_ENV, "") or "warn"
    if mode not in ("warn", "error"):
        raise ConfigError(f"{DIVERGENCE_ENV}={mode!r}: give warn or error")
    return mode


class Divergence:
    """A run that diverges says so: the first time a step's training loss is far above the first
    step's (RATIO times it, and at least MARGIN above), a warning names the likely cause (the
    learning rate: too high for this model, batch and warm-up) and the flag that changes it.
    Once per run. A loss that is not a number stops the run instead (TrainingDiverged)."""

    RATIO, MARGIN = 3.0, 2.0

    def __init__(self, peak_lr: float):
        self.peak_lr, self.said = peak_lr, False
        self.start: Optional[tuple[int, float]] = None  # (step, loss) of the first finite loss

    def check(self, step: int, loss: float, lr: float) -> Optional[str]:
        if self.said or not math.isfinite(loss):
            return None
        if self.start is None:
            self.start = (step, loss)
            return None
        if loss <= max(self.RATIO * self.start[1], self.start[1] + self.MARGIN):
            return None
        self.said = True
        return (f"the training loss went from {self.start[1]:.4g} at step {self.start[0]} to {loss:.4g} at step "
                f"{step}: the run is diverging, most likely from a learning rate too high for "
                f"this model and batch (optim.lr={self.peak_lr:g}, {lr:.2e} at this step); lower it with --lr "
                f"(e.g. --lr {self.peak_lr / 10:g}) or warm up longer (--warmup-steps)")


def eval_batches(batches: Iterable, split: str, count: Optional[int], stream: Optional[TextIO] = None,
                 quiet: bool = False) -> Iterable:
    """Evaluation batches with vitlab.progress's progress: a bar over the images on a terminal;
    in a log, a line saying what is being evaluated (so a long final evaluation never looks
    like a hang) and the heartbeat."""
    size = f"{count:,} images" if count else "all images"
    shown = progress.Progress(count, f"eval {split}", "img", start=f"evaluating {split}: {size}", stream=stream,
                              quiet=quiet)
    return shown.wrap(batches, lambda batch: len(batch[1]))


def plot_run(folder, results: dict[str, dict[str, Any]], class_names: list[str], title: str = "",
             objective: str = "supervised") -> list[str]:
    """The run's figures: the learning curve and a confusion matrix per split. Returns notes
    for what could not be drawn (matplotlib is an optional extra)."""
    try:
        plot_learning_curve(folder.metrics, folder.path / "learning_curve.png", title, objective)
        for split, m in results.items():
            if "confusion" in m:
                plots.plot_confusion(m["confusion"], class_names, folder.path / f"confusion-{split}.png",
                                     title=f"{title}: {split}" if title else split)
    except ImportError:
        return ["matplotlib is not installed: no learning curve or confusion matrix (pip install 'vitlab[plots]')"]
    return []


def run_title(model: str, data_spec: str, run_name: str) -> str:
    """A run's figures' title: "ViT-Ti/4 on digits", with the run folder's name where it is
    not the data's own ("on digits (ft-small)", never "on digits (digits)")."""
    data = figure_label(data_spec)
    return f"{model} on {data}" + ("" if data.split(":")[-1] == run_name else f" ({run_name})")


def figure_label(spec: str) -> str:
    """A data spec as a figure's title names it: its kind and the last part of its path
    (`wds:/data/cifar10/train-{0..3}.tar` -> `wds:cifar10`), never a machine's absolute path."""
    kind, sep, rest = str(spec).partition(":")
    if not sep or not rest:
        return Path(kind).name or kind
    if ":" in rest and not rest.startswith("/"):  # vtab:TASK:ROOT names its task
        return f"{kind}:{rest.split(':')[0]}"
    parts = [p for p in Path(rest.split("{")[0]).parts if p not in ("/", "..", ".")]
    name = parts[-1] if parts else rest
    return f"{kind}:{name if not name.startswith(('train-', 'test-')) or len(parts) < 2 else parts[-2]}"


def next_commands(checkpoint: str, data: str, out: Path) -> list[str]:
    """What to run on a finished run's checkpoint: evaluate, predict, look inside, few-shot
    (quoted for a shell where they need it: a wds pattern's braces would expand)."""
    checkpoint, data, out = shlex.quote(str(checkpoint)), shlex.quote(data), Path(out)
    return ["next:", f"  vitlab eval {checkpoint} --data {data}", f"  vitlab predict {checkpoint} IMAGE...",
            f"  vitlab inspect {checkpoint} --images {data} --out {shlex.quote(str(out / 'inspect'))}",
            f"  vitlab fewshot {checkpoint} --data {data}"]


def final_report(folder, summary: dict[str, Any], results: dict[str, dict[str, Any]], notes: list[str],
                 tracker_lines: Sequence[str] = (), cfg: Any = None) -> str:
    """What `vitlab train` and `finetune` print at the end: the results, where every output is,
    and for a classifier (its RunConfig `cfg`), trained or fine-tuned, the commands that use the
    checkpoint next; not for a fine-tune sweep's arm (trained on train-minus-dev), whose final
    run says them."""
    arm = cfg is not None and cfg.data.train_split == "train-minus-dev"
    data = "" if cfg is None or arm or cfg.train.objective != "supervised" else cfg.data.name
    lines = [f"done: {summary['steps']} steps in {summary['train_seconds']:.1f} s"]
    start = summary.get("head_probe", {}).get("start", {})  # the linear-probe head's score at step 0
    for split, m in results.items():
        if "top1" in m:
            began = f"  (step 0, the probe head alone: {start[split]:.2%})" if split in start else ""
            lines.append(f"  {split}: top-1 {m['top1']:.2%}  top-5 {m['top5']:.2%}  loss {m['loss']:.4f}{began}")
        elif "color_acc" in m:
            lines.append(f"  {split}: colour accuracy {m['color_acc']:.2%}  loss {m['loss']:.4f}")
    if summary["bad_images_skipped"]:
        lines.append(f"  skipped {summary['bad_images_skipped']} unreadable images (--skip-bad-images)")
    if summary.get("compute"):
        lines.append(format_compute(summary["compute"]))
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
    for split in results:
        if (out / f"confusion-{split}.png").exists():
            lines.append(f"  confusion       {out / f'confusion-{split}.png'}")
    lines += [f"  {line}" for line in tracker_lines]
    lines += [f"  note: {n}" for n in notes]
    if data:
        lines += next_commands(summary["checkpoint"], data, out)
    return "\n".join(lines)


def read_curves(metrics_path: Path) -> dict[str, dict[str, list]]:
    """metrics.jsonl as one series per split: step, loss, accuracy and (train) lr."""
    series: dict[str, dict[str, list]] = {}
    records = read_json_lines(metrics_path, {"step": int, "split?": str}, "metrics log",
                              "remove the damaged line (or the file) to draw the curve", ConfigError)
    for r in records:
        s = series.setdefault(r.get("split", "train"), {"step": [], "loss": [], "accuracy": [], "lr": []})
        s["step"].append(r["step"])
        s["loss"].append(r.get("loss", float("nan")))
        s["accuracy"].append(r.get("accuracy", r.get("top1", r.get("color_acc", float("nan")))))
        s["lr"].append(r.get("lr", float("nan")))
    return series


def plot_learning_curve(metrics_path: Path, out: Path, title: str = "", objective: str = "supervised") -> Path:
    """Loss and accuracy against step (the training windows as lines, each evaluation as a
    point), the learning rate on a second axis. Raises ImportError without matplotlib."""
    label = ACCURACY_LABELS.get(objective, "accuracy")
    return plots.plot_learning_curve(read_curves(metrics_path), out, title=title, accuracy_label=label)


def plan_line(run: Any, cfg: Any) -> str:
    """The run's first line: the model, the data, the steps and where they run (`run` a
    vitlab.train.loop.Run, `cfg` its RunConfig)."""
    mc, plan, t = run.model.config, run.plan, cfg.train
    n_params = sum(p.numel() for p in run.model.parameters())
    return (
        f"training {mc.name} at {mc.image_size[0]}x{mc.image_size[1]} px ({n_params:,} parameters) "
        f"on {cfg.data.name}: {len(run.train_set):,} images, "
        f"{mc.num_classes} classes, {plan.total} steps of {t.batch_size} ({plan.per_epoch} per epoch), "
        f"{run.ctx.world} process(es) on {run.ctx.device}"
    ) + (f"; {grid_note(mc)}" if grid_note(mc) else "")
