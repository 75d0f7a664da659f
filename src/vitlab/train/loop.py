"""The training loop: one loop for every objective, recipe and number of processes.

    summary = Trainer(config, out="runs/digits").run()

`run` reads top to bottom: claim the run folder, prepare (seed, data, model, objective,
plan), restore the newest checkpoint if there is one, train, evaluate, report. Each
optimiser step takes one global batch (split over processes and micro-batches), the loss,
the gradient (clipped at global norm `optim.clip_grad_norm`), the learning rate of the
schedule, the step, the EMA. A non-finite loss stops the run before it touches the weights,
so the last checkpoint stays the last good state.

Exact resume: everything a step depends on is either saved (weights, optimiser, EMA,
Python/NumPy/torch random states) or a function of (seed, step) (the data order and each
image's augmentation, see vitlab.data.loader). On CPU a resumed run's weights are
bit-identical to an uninterrupted run's.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from vitlab.config import ConfigError, RunConfig
from vitlab.data import make_loader
from vitlab.data.loader import batches_per_epoch
from vitlab.eval.accuracy import add_counts
from vitlab.files import atomic_write_text
from vitlab.train import distributed, state
from vitlab.train.build import build_model, open_datasets, architecture
from vitlab.train.objectives import Objective, build_objective
from vitlab.train.optim import EMA, build_optimizer, lr_at
from vitlab.train.report import MetricsLog, Progress, final_report, plot_run, truncate_after
from vitlab.train.run_folder import RunFolder


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the last good checkpoint."""


@dataclass
class Plan:
    """How long and in what pieces: global steps, batches per epoch, per-process batch, micro-batch."""

    total: int
    per_epoch: int
    per_rank: int
    micro: int


@dataclass
class Run:
    """The live objects of one training run on one process."""

    ctx: distributed.Context
    cfg: RunConfig
    model: nn.Module
    objective: Objective
    train_set: Any
    eval_sets: dict[str, Any]
    plan: Plan
    wrapped: Optional[nn.Module] = None
    step_fn: Any = None
    optimizer: Optional[torch.optim.Optimizer] = None
    ema: Optional[EMA] = None
    start: int = 0
    prior_seconds: float = 0.0
    last_good: Optional[Path] = None
    log: Optional[MetricsLog] = None
    progress: Optional[Progress] = None
    window: dict[str, float] = field(default_factory=dict)
    bad_images: int = 0


def new_window() -> dict[str, float]:
    """The running sums of one log window: loss, accuracy and steps, images, start time."""
    return {"loss": 0.0, "acc": 0.0, "n": 0, "images": 0, "t": time.perf_counter()}


class Trainer:
    def __init__(self, config: RunConfig, out: str | Path, command: str = "", quiet: bool = False):
        self.cfg = config
        self.folder = RunFolder(out)
        self.out = self.folder.path
        self.command = command
        self.quiet = quiet

    def run(self) -> dict[str, Any]:
        t = self.cfg.train
        ctx = distributed.setup(t.device, t.parallel)
        self.ctx = ctx
        try:
            mode = self._claim_folder(ctx)
            run = self._prepare(ctx)
            resume_from = state.latest(self.folder.checkpoints) if mode == "resume" else None
            if resume_from is None and mode == "resume" and ctx.is_main:
                truncate_after(self.folder.metrics, 0)  # died before its first checkpoint: start again
            if resume_from == run.plan.total and self.folder.summary.exists():
                self._say(f"{self.out}: this run is already complete ({run.plan.total} steps); "
                          f"its results are in {self.folder.summary}")
                return json.loads(self.folder.summary.read_text())
            self._restore(run, resume_from)
            train_seconds = self._train(run)
            results = self._evaluate(run, run.plan.total, final=True)
            return self._finish(run, results, train_seconds)
        finally:
            distributed.cleanup(ctx)

    def _say(self, text: str) -> None:
        if self.ctx.is_main and not self.quiet:
            print(text, flush=True)

    # Prepare ------------------------------------------------------------------------------
    def _claim_folder(self, ctx: distributed.Context) -> str:
        """"new" or "resume", decided on rank 0 and told to every process (a refusal too,
        or the others would wait for it forever)."""
        mode: Any = None
        if ctx.is_main:
            try:
                mode = self.folder.state(self.cfg)
            except ConfigError as e:
                mode = e
        mode = distributed.broadcast_object(mode, ctx)
        if isinstance(mode, Exception):
            raise mode
        return mode

    def _prepare(self, ctx: distributed.Context) -> Run:
        """Seed, open the data, build the model and its objective, and plan the steps. The
        order is part of exact resume: it fixes what the random stream initialises."""
        cfg, t = self.cfg, self.cfg.train
        if t.threads:
            torch.set_num_threads(t.threads)
        random.seed(t.seed)
        np.random.seed(t.seed)
        torch.manual_seed(t.seed)
        train_set, eval_sets = open_datasets(cfg, architecture(cfg.model))
        model = build_model(cfg.model, train_set.class_names)
        objective = build_objective(model, cfg)
        return Run(ctx, cfg, model, objective, train_set, eval_sets, self._plan(train_set, ctx))

    def _plan(self, train_set: Any, ctx: distributed.Context) -> Plan:
        t = self.cfg.train
        if t.batch_size % ctx.world:
            raise ConfigError(f"train.batch_size {t.batch_size} is not divisible by the {ctx.world} processes")
        per_rank = t.batch_size // ctx.world
        micro = t.micro_batch_size or per_rank
        if per_rank % micro:
            raise ConfigError(f"the per-process batch {per_rank} is not a multiple of train.micro_batch_size {micro}")
        per_epoch = batches_per_epoch(train_set, t.batch_size)
        if per_epoch < 1:
            raise ConfigError(f"train.batch_size {t.batch_size} exceeds the {len(train_set)} training images")
        total = t.steps or math.ceil(t.epochs * per_epoch)
        if total < 1:
            raise ConfigError("set train.steps (--steps) or train.epochs (--epochs)")
        return Plan(total, per_epoch, per_rank, micro)

    # Restore ------------------------------------------------------------------------------
    def _restore(self, run: Run, resume_from: Optional[int]) -> None:
        """Weights first (plain modules), then wrapping and the optimiser, then the
        optimiser's state and the random states."""
        ctx, t = run.ctx, self.cfg.train
        saved = None
        if resume_from is not None:
            saved = state.load_weights(self.folder.checkpoints, resume_from, run.model, run.objective)
            run.start, run.last_good = resume_from, state.step_paths(self.folder.checkpoints, resume_from)[0]
            run.prior_seconds = float(saved.meta.get("train_seconds", 0.0))
        run.objective.to(ctx.device)
        run.model.set_grad_checkpointing(t.grad_checkpointing)
        run.wrapped = distributed.wrap(run.objective, ctx, inner=run.model)
        run.optimizer = build_optimizer(run.objective, self.cfg.optim)
        run.ema = EMA(run.model, t.ema) if t.ema > 0 else None
        run.step_fn = torch.compile(run.wrapped) if t.compile else run.wrapped
        if ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            self.folder.write_config(self.cfg, self.command)
            if saved is not None:
                truncate_after(self.folder.metrics, resume_from)
        distributed.barrier(ctx)
        run.window = new_window()
        if saved is not None:
            note = state.restore_training(saved, run, t.seed)
            if note:
                self._say(f"note: {note}")
            run.window.update(saved.meta.get("log_window", {}))
            self._say(f"resuming {self.out} from step {run.start} of {run.plan.total}")
        elif ctx.rank > 0:
            torch.manual_seed(t.seed + 7919 * ctx.rank)  # different dropout/Mixup draws per process

    # Train --------------------------------------------------------------------------------
    def _train(self, run: Run) -> float:
        """Every step from run.start to the end; returns the training seconds (all sessions)."""
        cfg, t, ctx = self.cfg, self.cfg.train, run.ctx
        if ctx.is_main:
            run.log = MetricsLog(self.out)
            run.progress = None if self.quiet else Progress(run.plan.total, run.start)
        self._say(self._plan_line(run))
        loader = iter(make_loader(
            run.train_set, run.plan.per_rank, seed=t.seed, rank=ctx.rank, world=ctx.world, train=True,
            start_step=run.start, num_steps=run.plan.total - run.start, num_workers=cfg.data.num_workers,
        ))
        t_start = time.perf_counter()
        step = run.start
        try:
            while step < run.plan.total:
                images, labels, bad = next(loader)
                run.bad_images += bad
                lr = lr_at(step, run.plan.total, cfg.optim)
                loss, acc = self._step(run, step, images, labels, lr)
                step += 1
                self._log_step(run, step, loss, acc, lr, labels.shape[0])
                if t.eval_every and step % t.eval_every == 0 and step < run.plan.total:
                    self._evaluate(run, step)
                if step % t.ckpt_every == 0 or step == run.plan.total:
                    self._save(run, step, run.prior_seconds + time.perf_counter() - t_start)
        finally:
            if run.progress:
                run.progress.close()
        return run.prior_seconds + time.perf_counter() - t_start

    def _plan_line(self, run: Run) -> str:
        mc, plan, t = run.model.config, run.plan, self.cfg.train
        n_params = sum(p.numel() for p in run.model.parameters())
        return (
            f"training {mc.name} at {mc.image_size[0]}x{mc.image_size[1]} px ({n_params:,} parameters) "
            f"on {self.cfg.data.name}: {len(run.train_set):,} images, "
            f"{mc.num_classes} classes, {plan.total} steps of {t.batch_size} ({plan.per_epoch} per epoch), "
            f"{run.ctx.world} process(es) on {run.ctx.device}"
        )

    def _step(self, run: Run, step: int, images: torch.Tensor, labels: torch.Tensor, lr: float) -> tuple[float, float]:
        """One optimiser step over this process's share of the global batch."""
        ctx, optim_cfg = run.ctx, self.cfg.optim
        for g in run.optimizer.param_groups:
            g["lr"] = lr
        run.objective.train()
        n = labels.shape[0]
        chunks = list(zip(images.split(run.plan.micro), labels.split(run.plan.micro))) if n else []
        loss_value, acc_value = 0.0, 0.0
        for i, (x, y) in enumerate(chunks):
            x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
            with distributed.no_sync(run.wrapped, skip=i < len(chunks) - 1), torch.autocast(**self._autocast(ctx)):
                loss, metrics = run.step_fn(x, y)
                (loss * (y.shape[0] / n)).backward()  # the mean over this process's batch, however split
            loss_value += float(loss.detach()) * y.shape[0] / n
            acc_value += float(metrics.get("accuracy", float("nan"))) * y.shape[0] / n
        grad_norm = float("nan")
        if optim_cfg.clip_grad_norm > 0:
            params = [p for p in run.objective.parameters() if p.requires_grad]
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, optim_cfg.clip_grad_norm))
        bad = not math.isfinite(loss_value) or (optim_cfg.clip_grad_norm > 0 and not math.isfinite(grad_norm))
        if distributed.any_flag(bad, ctx):
            where = f"the last good checkpoint is {run.last_good}" if run.last_good else "no checkpoint was written yet"
            raise TrainingDiverged(
                f"step {step + 1}: the loss is {loss_value} (gradient norm {grad_norm}); stopped before "
                f"updating the weights, {where}. Lower optim.lr, lengthen optim.warmup_steps or keep "
                "optim.clip_grad_norm=1"
            )
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        if run.ema is not None:
            run.ema.update(run.model)
        return loss_value, acc_value

    def _autocast(self, ctx: distributed.Context) -> dict[str, Any]:
        return dict(device_type=ctx.device.type, dtype=torch.bfloat16, enabled=self.cfg.train.precision == "bf16")

    def _log_step(self, run: Run, step: int, loss: float, acc: float, lr: float, n: int) -> None:
        w, t = run.window, self.cfg.train
        w["loss"] += loss
        w["acc"] += acc
        w["n"] += 1
        w["images"] += n * run.ctx.world
        log_now = step % t.log_every == 0 or step == run.plan.total
        if run.ctx.is_main:
            rate = w["images"] / max(time.perf_counter() - w["t"], 1e-9)
            if run.progress:
                run.progress.update(step, loss, lr, rate, log_now)
            if log_now:
                run.log.write({
                    "step": step, "epoch": round(step / run.plan.per_epoch, 4), "split": "train",
                    "loss": w["loss"] / w["n"], "accuracy": w["acc"] / w["n"], "lr": lr, "images_per_s": round(rate, 2),
                })
        if log_now:
            run.window = new_window()

    # Evaluate -----------------------------------------------------------------------------
    def _evaluate(self, run: Run, step: int, final: bool = False) -> dict[str, dict[str, Any]]:
        """Each evaluation split, with the EMA weights when Polyak averaging is on."""
        ctx, t = run.ctx, self.cfg.train
        target = run.objective
        if run.ema is not None:
            target = copy.deepcopy(run.objective)
            run.ema.copy_to(target.model)
        target.eval()
        results = {}
        for split, dataset in run.eval_sets.items():
            loader = make_loader(
                dataset, t.eval_batch_size or max(t.batch_size // ctx.world, 1), rank=ctx.rank, world=ctx.world,
                train=False, num_workers=self.cfg.data.num_workers,
            )
            sums = None
            with torch.no_grad(), torch.autocast(**self._autocast(ctx)):
                for images, labels, _ in loader:
                    if labels.numel():
                        sums = add_counts(sums, target.eval_step(images.to(ctx.device), labels.to(ctx.device)))
            if sums is None:
                raise ConfigError(f"the {split} split of {self.cfg.data.eval_data or self.cfg.data.name} is empty")
            sums = distributed.sum_tensors({k: v.to(ctx.device) for k, v in sums.items()}, ctx)
            results[split] = target.finish_eval(sums)
            if ctx.is_main:
                self._log_eval(run, step, split, results[split], final)
        run.objective.train()
        return results

    def _log_eval(self, run: Run, step: int, split: str, metrics: dict[str, Any], final: bool) -> None:
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        record = {"step": step, "epoch": round(step / run.plan.per_epoch, 4), "split": split, **scalars}
        if "top1" in scalars:
            record["accuracy"] = scalars["top1"]
        run.log.write(record)
        line = f"eval {split} @ step {step}: " + "  ".join(f"{k} {v:.4f}" for k, v in scalars.items() if k != "count")
        if run.progress and not final:
            run.progress.message(line)
        elif not self.quiet:
            print(line, flush=True)

    # Save and report ----------------------------------------------------------------------
    def _save(self, run: Run, step: int, seconds: float) -> None:
        info = {"step": step, **run.objective.checkpoint_metadata()}
        partial = {k: run.window[k] for k in ("loss", "acc", "n")}  # the unfinished log window
        extra = {"total_steps": run.plan.total, "train_seconds": seconds, "log_window": partial}
        run.last_good = state.save_checkpoint(self.folder.checkpoints, step, run, info, extra)

    def _finish(self, run: Run, results: dict[str, dict[str, Any]], seconds: float) -> dict[str, Any]:
        names = run.model.class_names
        bad = distributed.sum_tensors({"bad": torch.tensor([float(run.bad_images)], device=run.ctx.device)}, run.ctx)
        ckpt = self.folder.checkpoint_file("ema.safetensors" if run.ema is not None else "last.safetensors")
        splits = {}
        for split, m in results.items():
            entry = {k: v for k, v in m.items() if k != "confusion"}
            if isinstance(entry.get("per_class"), list):
                entry["per_class"] = dict(zip(names, entry["per_class"]))
            splits[split] = entry
        summary = {
            "model": run.model.config.name,
            "steps": run.plan.total, "epochs": round(run.plan.total / run.plan.per_epoch, 3), "splits": splits,
            "checkpoint": str(ckpt), "ema": self.cfg.train.ema or None, "train_seconds": round(seconds, 1),
            "bad_images_skipped": int(bad["bad"].item()), "world_size": run.ctx.world,
        }
        if not run.ctx.is_main:
            return summary
        run.log.close()
        atomic_write_text(self.folder.summary, json.dumps(summary, indent=2))
        notes = plot_run(self.folder, results, names) + ([run.log.tb_note] if run.log.tb_note else [])
        if not self.quiet:
            print(final_report(self.folder, summary, results, notes), flush=True)
        return summary
