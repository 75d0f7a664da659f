"""The run folder: what a training run writes, and the check that a folder holds this run.

    runs/digits/
      config.yaml        the resolved config (`vitlab train --config config.yaml` reruns it)
      metrics.jsonl      one JSON object per log window and per evaluation
      summary.json       final metrics, compute and the checkpoint path
      checkpoints/       step-N model + state files, last.safetensors (see state.py)
      learning_curve.png, confusion_<split>.png, tensorboard/

Rerunning into the same folder continues the run; a different config is refused, so a run's
outputs are never overwritten by another run's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

import yaml

from vitlab.config import ConfigError, RunConfig
from vitlab.files import atomic_write_text

# Config keys that may change between a run and its resumption: none of them changes a number.
RESUMABLE_CHANGES = {
    "data.num_workers", "train.log_every", "train.eval_batch_size", "train.keep_checkpoints",
    "train.ckpt_every", "train.device", "train.threads",
}


class RunFolder:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config = self.path / "config.yaml"
        self.metrics = self.path / "metrics.jsonl"
        self.summary = self.path / "summary.json"
        self.checkpoints = self.path / "checkpoints"

    def state(self, cfg: RunConfig, allow: Iterable[str] = ()) -> str:
        """"new" (absent or empty) or "resume" (this run's folder); refuses anything else.
        `allow`: keys that may differ besides RESUMABLE_CHANGES (an extended run's length)."""
        if not self.path.exists() or (self.path.is_dir() and not any(self.path.iterdir())):
            return "new"
        if not self.path.is_dir():
            raise ConfigError(f"--out {self.path} is a file; give a folder for the run")
        if not self.config.exists():
            raise ConfigError(
                f"{self.path} exists and is not a vitlab run folder (no config.yaml); refusing to write into it: "
                "choose a new --out folder"
            )
        diffs = config_differences(self.read_config(), cfg, RESUMABLE_CHANGES | set(allow))
        if diffs:
            raise ConfigError(
                f"{self.path} holds a run with a different config ({'; '.join(diffs[:6])}); "
                "its outputs are kept: use another --out to start a new run, or the same settings to continue it"
            )
        return "resume"

    def read_config(self) -> RunConfig:
        try:
            return RunConfig.from_dict(yaml.safe_load(self.config.read_text()))
        except yaml.YAMLError as e:
            raise ConfigError(f"{self.config}: not valid YAML ({str(e).splitlines()[0]})") from None

    def write_config(self, cfg: RunConfig, command: str = "") -> None:
        header = "# Resolved config of this run (vitlab train --config this-file reruns it)\n"
        if command:
            header += f"# command: {command}\n"
        atomic_write_text(self.config, header + yaml.safe_dump(cfg.to_dict(), sort_keys=False))

    def checkpoint_file(self, name: str = "last.safetensors") -> Path:
        return self.checkpoints / name


def config_differences(old: RunConfig, new: RunConfig, ignore: Optional[set[str]] = None) -> list[str]:
    """"section.key: old -> new" for every setting that changes a number."""
    ignore = RESUMABLE_CHANGES if ignore is None else ignore
    a, b = old.to_dict(), new.to_dict()
    return [
        f"{s}.{k}: {a[s].get(k)!r} -> {b[s].get(k)!r}"
        for s in b
        for k in sorted(set(a[s]) | set(b[s]))
        if a[s].get(k) != b[s].get(k) and f"{s}.{k}" not in ignore
    ]
