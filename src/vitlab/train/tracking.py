"""Experiment trackers a run can also log to (`vitlab train --log wandb|mlflow|tensorboard`).

Off by default, and nothing is imported unless asked for: metrics.jsonl in the run folder
is always written and is the record; a tracker receives the same records. Each tracker's
package is an optional extra (`pip install 'vitlab[wandb]'`, `[mlflow]`, `[tensorboard]`),
checked before the run starts so that a missing one costs no training time.

- tensorboard: event files in RUN/tensorboard (`tensorboard --logdir RUN/tensorboard`).
- wandb: a Weights & Biases run in RUN/wandb; the project is $WANDB_PROJECT or "vitlab",
  WANDB_MODE=offline keeps it on disk (`wandb sync RUN/wandb/offline-run-*` uploads it).
- mlflow: an MLflow run in the tracking store $MLFLOW_TRACKING_URI (MLflow's own default
  otherwise); the experiment is $MLFLOW_EXPERIMENT_NAME or "vitlab".

A resumed run continues the same tracker run: the ids are kept in RUN/trackers.json.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from vitlab.config import ConfigError
from vitlab.extras import require
from vitlab.files import atomic_write_text
from vitlab.files.documents import read_json

TRACKERS = ("tensorboard", "wandb", "mlflow")  # each the name of the pip extra that installs it


def check(names: list[str]) -> None:
    """Refuse, before anything runs, a tracker that is unknown or not installed."""
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"--log {name}: not a tracker; choose from {', '.join(TRACKERS)}")
        require(name, f"--log {name}", modules=(), error=ConfigError)


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """A metrics record's finite numbers as "split/name" (the step and epoch excepted)."""
    split = record.get("split", "train")
    return {
        f"{split}/{k}": float(v) for k, v in record.items()
        if k not in ("step", "split", "epoch") and isinstance(v, (int, float)) and not isinstance(v, bool)
        and math.isfinite(v)
    }


class Tracker:
    """One tracker: `log(record)` per metrics.jsonl line, `close()` at the end; `where` says
    where its output is, for the final print."""

    where = ""

    def log(self, record: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoard(Tracker):
    def __init__(self, folder: Path, config: dict[str, Any], ids: dict[str, str]):
        from torch.utils.tensorboard import SummaryWriter  # optional: the tensorboard extra

        self.writer = SummaryWriter(str(folder / "tensorboard"))
        self.where = f"tensorboard     tensorboard --logdir {folder / 'tensorboard'}"

    def log(self, record: dict[str, Any]) -> None:
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, record["step"])

    def close(self) -> None:
        self.writer.close()


class WandB(Tracker):
    def __init__(self, folder: Path, config: dict[str, Any], ids: dict[str, str]):
        import wandb  # optional: the wandb extra

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "vitlab"), name=folder.name, dir=str(folder), config=config,
            id=ids.get("wandb"), resume="allow",
        )
        ids["wandb"] = self.run.id
        self.where = f"wandb           {folder / 'wandb'} (run {self.run.id})"

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.run.finish()


class MLflow(Tracker):
    def __init__(self, folder: Path, config: dict[str, Any], ids: dict[str, str]):
        import mlflow  # optional: the mlflow extra

        self.mlflow = mlflow
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "vitlab"))
        resumed = "mlflow" in ids
        run = mlflow.start_run(run_id=ids.get("mlflow"), run_name=None if resumed else folder.name)
        ids["mlflow"] = run.info.run_id
        if not resumed:  # parameters are write-once in MLflow; an extended run keeps its first ones
            mlflow.log_params({f"{s}.{k}": json.dumps(v) for s, values in config.items() for k, v in values.items()})
        self.where = f"mlflow          {mlflow.get_tracking_uri()} (run {run.info.run_id})"

    def log(self, record: dict[str, Any]) -> None:
        self.mlflow.log_metrics(scalars(record), step=record["step"])

    def close(self) -> None:
        self.mlflow.end_run()


CLASSES = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}
FIXES = {
    "tensorboard": "check that RUN/tensorboard is writable",
    "wandb": "run `wandb login`, or set WANDB_MODE=offline to keep the run on disk",
    "mlflow": "set MLFLOW_TRACKING_URI to a tracking server or a local store (file:./mlruns with "
              "MLFLOW_ALLOW_FILE_STORE=true, or sqlite:///mlflow.db with the full mlflow package)",
}


def open_trackers(names: list[str], folder: Path, config: dict[str, Any]) -> list[Tracker]:
    """The trackers asked for, each continuing its run of an earlier session of this folder."""
    check(names)
    ids_file = folder / "trackers.json"
    ids = read_json(ids_file, {str: (str, int, None)}, "list of tracker runs", "delete it to start new tracker runs",
                    ConfigError) if ids_file.exists() else {}
    trackers: list[Tracker] = []
    for name in dict.fromkeys(names):
        try:
            trackers.append(CLASSES[name](folder, config, ids))
        except Exception as e:  # each library has its own errors; the user needs one line and a fix
            for tracker in trackers:
                tracker.close()
            reason = (str(e).strip().splitlines() or [""])[0][:300]
            raise ConfigError(f"--log {name}: {name} could not start ({type(e).__name__}: {reason}); {FIXES[name]}") from None
    if names:
        atomic_write_text(ids_file, json.dumps(ids, indent=2) + "\n")
    return trackers
