"""The one place that knows what a training run's folder holds, and under which names:

    RUN/config.yaml               the resolved config (vitlab train --config RUN/config.yaml reruns it)
    RUN/metrics.jsonl             one JSON object per logged step and evaluation
    RUN/summary.json              the final numbers, written when the run completes
    RUN/eval/                     `vitlab eval`'s results for a checkpoint of the run
    RUN/checkpoints/last.safetensors   the newest weights (ema.safetensors: the Polyak average)
    RUN/checkpoints/step-N[.state].safetensors  each checkpoint's weights and training state
                                  (train/state.py names and prunes these)

train/run_folder.py writes it (RunFolder builds on RunLayout); `vitlab push`, the model card,
`vitlab sweep` and `vitlab eval` find a run's files through it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
EVAL = "eval"  # what `vitlab eval` of the run's checkpoints writes
LAST = "last.safetensors"
EMA = "ema.safetensors"
# What a finished run's summary.json holds for everything that reads it back (sweep tables, a
# fine-tune's choice, the model card, vtab), as files.documents checks it: each split's
# metrics finite numbers, and the step count, the checkpoint's path.
SUMMARY_SHAPE = {"splits?": {str: {"top1?": float, "top5?": float, "count?": int}}, "steps?": int,
                 "checkpoint?": (str, None)}


class RunLayout:
    """The paths of one run folder."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.config = self.path / CONFIG
        self.metrics = self.path / METRICS
        self.summary = self.path / SUMMARY
        self.checkpoints = self.path / CHECKPOINTS

    def checkpoint_file(self, name: str = LAST) -> Path:
        return self.checkpoints / name

    @property
    def last(self) -> Path:
        """The newest weights."""
        return self.checkpoint_file(LAST)


def holding_run(checkpoint: str | os.PathLike) -> Optional[RunLayout]:
    """The run folder a checkpoint file sits in, RUN for RUN/checkpoints/FILE, finished or
    not; None for a file anywhere else."""
    p = Path(checkpoint)
    return RunLayout(p.parent.parent) if p.parent.name == CHECKPOINTS else None


def run_of(path: str | os.PathLike) -> Optional[RunLayout]:
    """The completed run a path belongs to: the run folder itself, or RUN for
    RUN/checkpoints/FILE; None for anything else."""
    for run in (RunLayout(path), holding_run(path)):
        if run is not None and run.summary.is_file():
            return run
    return None


def results_folder(checkpoint: str | os.PathLike) -> Optional[Path]:
    """Where `vitlab eval` of a checkpoint in RUN/checkpoints/ writes: RUN/eval; None for a
    checkpoint outside a run folder (nothing is written into the current directory unasked)."""
    run = holding_run(checkpoint)
    return run.path / EVAL if run is not None else None
