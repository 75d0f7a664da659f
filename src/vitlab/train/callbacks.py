"""Callbacks: code the trainer calls at its events, and the two it ships (early stopping and
keeping the best checkpoint, the protocol of the paper's Fig. 4 / Appendix B.1).

    class Printer(Callback):
        def on_eval(self, trainer, run, step, results):
            print(step, results["dev"]["top1"])

    Trainer(config, "runs/x", Inputs(), callbacks=[Printer()]).run()

The events, in the order a run meets them:

    on_log(trainer, run, step, record)     a metrics record was written (rank 0 only)
    on_eval(trainer, run, step, results)   a periodic evaluation, {split: metrics} (every process:
                                           the metrics are summed over processes first)
    on_checkpoint(trainer, run, step, path) a checkpoint was written (every process)
    on_end(trainer, run, step) -> dict     training is over (every process); what it returns
                                           goes into summary.json

A callback stops the run with `trainer.request_stop(reason)`: the trainer writes a
checkpoint at that step and evaluates as at the end. State a callback must keep across an
interruption goes in `state_dict()` / `load_state_dict()` (by default the attributes its
`resume_state` names): it is saved in every checkpoint and restored on resume, so a resumed run
decides exactly as an uninterrupted one.

From the config: `train.early_stop.metric=dev.top1 train.early_stop.patience=5` (stop after
5 evaluations without improvement) and `train.keep_best=dev.top1` (best.safetensors). A
metric is SPLIT.NAME of the evaluation splits (`data.eval_splits`, e.g. dev and test with
`data.train_split=train-minus-dev`); `loss` is minimised, anything else maximised, unless
`train.early_stop.mode` says otherwise.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence

from vitlab.checkpoints import io
from vitlab.config import ConfigError, RunConfig
from vitlab.train import distributed

BEST_FILE = "best.safetensors"


class Callback:
    """The interface; every method is optional. `name` keys the state saved in checkpoints;
    `resume_state` names the attributes that state is (saved and restored as they are: JSON
    values)."""

    name = "callback"
    resume_state: tuple[str, ...] = ()

    def on_log(self, trainer: Any, run: Any, step: int, record: dict[str, Any]) -> None:
        pass

    def on_eval(self, trainer: Any, run: Any, step: int, results: dict[str, dict[str, Any]]) -> None:
        pass

    def on_checkpoint(self, trainer: Any, run: Any, step: int, path: Path) -> None:
        pass

    def on_end(self, trainer: Any, run: Any, step: int) -> Optional[dict[str, Any]]:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.resume_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in self.resume_state:
            if k in state:  # (a key missing from an older checkpoint keeps its start value)
                setattr(self, k, state[k])


def lookup(results: dict[str, dict[str, Any]], metric: str, who: str) -> float:
    """`dev.top1` in {split: metrics}; a clear error naming what exists."""
    split, _, name = metric.partition(".")
    if split not in results or name not in results[split]:
        have = ", ".join(f"{s}.{k}" for s, m in results.items() for k, v in m.items() if isinstance(v, (int, float)))
        raise ConfigError(f"{who}={metric}: the evaluation has no {metric}; it has {have} (add the split to data.eval_splits)")
    return float(results[split][name])


def better(value: float, best: Optional[float], mode: str, min_delta: float = 0.0) -> bool:
    if best is None:
        return math.isfinite(value)
    return value > best + min_delta if mode == "max" else value < best - min_delta


def resolve_mode(metric: str, mode: str) -> str:
    if mode != "auto":
        return mode
    return "min" if metric.rpartition(".")[2] in ("loss", "nll", "error") else "max"


class EarlyStopping(Callback):
    """Stop after `patience` evaluations in a row without an improvement of more than
    `min_delta` in `metric` (evaluations every train.eval_every steps)."""

    name = "early_stop"
    resume_state = ("best", "best_step", "bad", "stopped")

    def __init__(self, metric: str, patience: int, min_delta: float = 0.0, mode: str = "auto"):
        self.metric, self.patience, self.min_delta = metric, patience, min_delta
        self.mode = resolve_mode(metric, mode)
        self.best: Optional[float] = None
        self.best_step = 0
        self.bad = 0
        self.stopped: Optional[int] = None

    def on_eval(self, trainer, run, step, results):
        value = lookup(results, self.metric, "train.early_stop.metric")
        if better(value, self.best, self.mode, self.min_delta):
            self.best, self.best_step, self.bad = value, step, 0
            return
        self.bad += 1
        if self.patience and self.bad >= self.patience:
            self.stopped = step
            trainer.request_stop(f"early stop: {self.metric} has not improved for {self.bad} evaluations "
                                 f"(best {self.best:.4f} at step {self.best_step})")

    def on_end(self, trainer, run, step):
        return {"early_stop": {"metric": self.metric, "patience": self.patience, "best": self.best,
                               "best_step": self.best_step, "stopped_at": self.stopped}}


class KeepBest(Callback):
    """Write checkpoints/best.safetensors (vitlab's model format; the EMA weights when
    train.ema is on) at each evaluation that improves `metric`, and put the best step, its
    value and that evaluation's metrics of every split in summary.json under `best`."""

    name = "keep_best"
    resume_state = ("best", "step", "splits")

    def __init__(self, metric: str, mode: str = "auto"):
        self.metric, self.mode = metric, resolve_mode(metric, mode)
        self.best: Optional[float] = None
        self.step = 0
        self.splits: dict[str, dict[str, Any]] = {}

    def on_eval(self, trainer, run, step, results):
        value = lookup(results, self.metric, "train.keep_best")
        if not better(value, self.best, self.mode):
            return
        self.best, self.step = value, step
        self.splits = {s: {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                       for s, m in results.items()}
        state = distributed.full_tensors(run.model.state_dict())  # collective under FSDP: every process
        if run.ema is not None:
            ema = distributed.full_tensors(run.ema.state_dict())
            state = {**state, **{k: v.to(state[k].dtype) for k, v in ema.items()}}
        if run.ctx.is_main:
            info = {"step": step, "keep_best": self.metric, "value": value, **run.objective.checkpoint_metadata()}
            io.write_state(run.model.config, state, run.model.class_names, trainer.folder.checkpoints / BEST_FILE,
                           extra_metadata=info)
        distributed.barrier(run.ctx)

    def on_end(self, trainer, run, step):
        if self.best is None:
            return {"best": None}
        path = trainer.folder.checkpoints / BEST_FILE
        return {"best": {"metric": self.metric, "value": self.best, "step": self.step, "checkpoint": str(path),
                         **self.splits}}


def from_config(cfg: RunConfig) -> list[Callback]:
    """The callbacks the config asks for (train.early_stop.*, train.keep_best)."""
    t = cfg.train
    out: list[Callback] = []
    wants = [w for w, on in (("train.early_stop.metric", t.early_stop.metric), ("train.keep_best", t.keep_best)) if on]
    if wants and not t.eval_every:
        raise ConfigError(f"{' and '.join(wants)} need periodic evaluations: set train.eval_every (--eval-every N)")
    if t.early_stop.metric:
        out.append(EarlyStopping(t.early_stop.metric, t.early_stop.patience, t.early_stop.min_delta, t.early_stop.mode))
    if t.keep_best:
        out.append(KeepBest(t.keep_best, t.early_stop.mode))
    return out


class Hooks:
    """The callbacks of one run, called in order; their states as one checkpoint entry."""

    def __init__(self, trainer: Any, run: Any, callbacks: Sequence[Callback]):
        self.trainer, self.run, self.callbacks = trainer, run, list(callbacks)
        names = [c.name for c in self.callbacks]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"two callbacks are named {', '.join(twice)}: give each its own `name`")

    def call(self, event: str, step: int, *args: Any) -> list[Any]:
        """Each callback's `on_EVENT(trainer, run, step, *args)`, in order; what they return."""
        return [getattr(c, f"on_{event}")(self.trainer, self.run, step, *args) for c in self.callbacks]

    def end(self, step: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for returned in self.call("end", step):
            out.update(returned or {})
        return out

    def state(self) -> dict[str, Any]:
        return {c.name: c.state_dict() for c in self.callbacks}

    def load(self, states: dict[str, Any]) -> None:
        for c in self.callbacks:
            if c.name in states:
                c.load_state_dict(states[c.name])
