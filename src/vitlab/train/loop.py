"""The training loop: one loop for every objective, recipe and number of processes.

    summary = Trainer(config, "runs/digits", Inputs()).run()  # Inputs: what its runs read once (inputs.py)

`run` reads top to bottom: claim the run folder, prepare (seed, data, model, objective,
plan), restore the newest checkpoint if there is one, train, evaluate, report. Each
optimiser step takes one global batch (split over processes and micro-batches), the loss,
the gradient (clipped at global norm `optim.clip_grad_norm`), the learning rate of the
schedule, the step, the EMA. A non-finite loss stops the run before it touches the weights:
the last checkpoint stays the last good state.

Exact resume: everything a step depends on is either saved (weights, optimiser, EMA,
Python/NumPy/torch random states) or a function of (seed, step) (the data order and each
image's augmentation, see vitlab.data.loader). On CPU a resumed run's weights are
bit-identical to an uninterrupted run's, stopped by a signal too (preemption.py).
"""

from __future__ import annotations

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

from vitlab import run_layout
from vitlab.config import ConfigError, RunConfig
from vitlab.config.model import grid_record
from vitlab.config.provenance import DATA_OBJECTS, SWEEP
from vitlab.data import known_length, make_loader
from vitlab.data.decode import model_input
from vitlab.data.loader import batches_per_epoch, close
from vitlab.deploy import training
from vitlab.eval.accuracy import add_counts
from vitlab.files import atomic_write_text
from vitlab.log import get_logger
from vitlab.models import Model
from vitlab.train import callbacks as cb, distributed, preemption, probe_head, report, state
from vitlab.train.build import architecture, build_model, describe_source, open_datasets, train_loader
from vitlab.train.compute import ComputeMeter
from vitlab.train.inputs import Inputs
from vitlab.train.objectives import Objective, build_objective, evaluation_target
from vitlab.train.optim import EMA, build_optimizer, lr_at
from vitlab.train.report import MetricsLog, Progress, TrainingDiverged, eval_batches, new_window
from vitlab.train.run_folder import RunFolder
from vitlab.train.tracking import check as check_trackers, open_trackers

LOG = get_logger("train")  # vitlab/log.py: what a run prints, silenced or redirected with logging
# Devices where train.precision=fp16 runs. fp16 autocast needs a loss scaler because fp16's
# range underflows small gradients; CPUs have no fp16 matrix units (bf16 is their fast type,
# with fp32's range and no scaler), so fp16 is refused there rather than run slowly.
FP16_DEVICES = ("cuda",)
# What `extend` lets differ from the run folder's config: the length (the schedule is then the
# new length's; the steps already taken stay as they were).
EXTENDABLE = frozenset({"train.steps", "train.epochs"})


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
    model: Model
    objective: Objective
    train_set: Any
    eval_sets: dict[str, Any]
    plan: Plan
    # wrapped, optimizer, compute: set by Trainer._restore, hooks by Trainer._prepare, before any use
    wrapped: nn.Module = field(init=False)
    step_fn: Any = None
    optimizer: torch.optim.Optimizer = field(init=False)
    ema: Optional[EMA] = None
    start: int = 0
    prior_seconds: float = 0.0
    last_good: Optional[Path] = None
    log: Optional[MetricsLog] = None
    progress: Optional[Progress] = None
    window: dict[str, float] = field(default_factory=dict)
    bad_images: set[str] = field(default_factory=set)  # names of the unreadable files skipped
    compute: ComputeMeter = field(init=False)
    scaler: Optional[torch.amp.GradScaler] = None  # fp16 only
    hooks: cb.Hooks = field(init=False)  # the callbacks (vitlab.train.callbacks)
    stop: str = ""  # why a callback ended the run early
    head_probe: Optional[dict[str, Any]] = None  # model.head_start=probe: how the head was fitted
    start_scores: dict[str, dict[str, Any]] = field(default_factory=dict)  # the probe head's, before step 1
    dense_shapes: list[list[int]] = field(default_factory=list)  # fp32 Dense shapes on oneDNN (deploy.training)
    compiled_gelu: bool = False  # the tanh GELU in one compiled pass (deploy.training.fast_gelu)
    packed_dense: bool = False  # the forward products on oneDNN's packed weights (deploy.training.dense_kernels)


class Trainer:
    """One training run. The data is the config's spec (`data.name`), or any dataset given as
    `data=` (a torch or torchvision Dataset, a Hugging Face `datasets.Dataset`, a DataLoader
    over a map-style dataset: see vitlab.data.foreign) with `eval_data=` one such set or a
    dict {split: set}; the config then records what they were. `notes` are printed with the
    plan line (what the fine-tuning defaults chose, and why). `quiet` prints only the final
    summary; `trackers` ("wandb", "mlflow", "tensorboard") also receive every metrics record;
    `extend` lets a finished or running run continue to a new train.steps/train.epochs
    (`vitlab train --resume RUN --steps N`); `callbacks` are vitlab.train.callbacks.Callback
    objects, called after the config's own (early stopping, keep-best); `inputs` what the
    runs of one plan read once and share (vitlab.train.inputs; `Inputs()` for a run alone)."""

    def __init__(self, config: RunConfig, out: str | Path, inputs: Inputs, command: str = "", quiet: bool = False,
                 data: Any = None, eval_data: Any = None, notes: tuple[str, ...] = (),
                 trackers: tuple[str, ...] = (), extend: bool = False, callbacks: tuple[cb.Callback, ...] = ()):
        self.sources: Optional[tuple[Any, dict[str, Any]]] = None
        self.run_state: Optional[Run] = None
        if data is not None:
            evals = eval_data if isinstance(eval_data, dict) else ({"test": eval_data} if eval_data is not None else {})
            self.sources = (data, evals)
            config = config.with_overrides({"data.name": describe_source(data), "data.eval_data": "",
                                            "data.eval_splits": list(evals)}, DATA_OBJECTS)
        elif eval_data is not None:
            raise ConfigError("eval_data= needs data= too (or put both in the config's data section)")
        self.cfg = config
        self.folder = RunFolder(out)
        self.out = self.folder.path
        self.command = command
        self.quiet = quiet
        self.notes = tuple(notes)
        self.trackers = tuple(trackers)
        self.extend = extend
        self.callbacks = tuple(callbacks)
        self.inputs = inputs

    def run(self) -> dict[str, Any]:
        t = self.cfg.train
        check_trackers(list(self.trackers))
        ctx = distributed.setup(t.device, t.parallel)
        self.ctx, self.watch = ctx, preemption.Watch(t.stop_signals, ctx)  # train.stop_signals, noted from now
        try:
            distributed.check_precision(t.precision, ctx, FP16_DEVICES)
            mode = self._claim_folder(ctx)
            run = self._prepare(ctx)
            resume_from = state.latest(self.folder.checkpoints) if mode == "resume" else None
            if resume_from is None and mode == "resume" and ctx.is_main:
                report.truncate_after(self.folder.metrics, 0)  # died before its first checkpoint: start again
            if resume_from is not None and resume_from > run.plan.total:
                raise ConfigError(f"{self.out} has already trained {resume_from} steps; to extend it, ask for more "
                                  f"than that (--steps), not {run.plan.total}")
            # finished: all its steps, or stopped early at its newest checkpoint, with a summary
            if resume_from is not None and self.folder.summary.exists() and (resume_from == run.plan.total or (
                    self.folder.read_summary().get("stopped_early", {}).get("step") == resume_from)):
                if ctx.is_main:  # printed with --quiet too: it is this command's summary
                    LOG.info(f"{self.out}: this run is already complete ({run.plan.total} steps); its results are in {self.folder.summary}")
                return self.folder.read_summary()
            self._restore(run, resume_from)
            train_seconds = self._train(run)
            summary = self._finish(run, self._evaluate(run, run.start, final=True), train_seconds)
            distributed.barrier(ctx)  # every process is done with the group before any destroys it
            return summary
        finally:
            self.watch.close()
            self.folder.release()
            # this frame's reference goes too: its modules hold the process group, which cleanup ends
            run = self.run_state = None  # type: ignore[assignment]  # `run` is not read after this line
            distributed.cleanup(ctx)

    def request_stop(self, reason: str) -> None:
        """End the run at this step (a callback's call): checkpoint, final evaluation, summary."""
        assert self.run_state is not None, "request_stop is called by a callback, during a run"
        self.run_state.stop = reason

    def _say(self, text: str) -> None:
        if self.ctx.is_main and not self.quiet:
            LOG.info(text)

    def _warn(self, text: str) -> None:  # a warning: on stderr, even with --quiet
        if self.ctx.is_main:
            LOG.warning(f"warning: {text}")

    # Prepare ------------------------------------------------------------------------------
    def _claim_folder(self, ctx: distributed.Context) -> str:
        """"new" or "resume", decided on rank 0 and told to every process (a refusal too,
        or the others would wait for it forever)."""
        mode: Any = None
        if ctx.is_main:
            try:
                mode = self.folder.state(self.cfg, allow=EXTENDABLE if self.extend else ())
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
        train_set, eval_sets = open_datasets(cfg, architecture(cfg.model, self.inputs), self.sources, self.inputs)
        model = build_model(cfg.model, train_set.class_names, self.inputs, t.precision)
        objective = build_objective(model, cfg)
        run = Run(ctx, cfg, model, objective, train_set, eval_sets, self._plan(train_set, ctx))
        run.hooks, self.run_state = cb.Hooks(self, run, [*cb.from_config(cfg), *self.callbacks]), run
        return run

    def _plan(self, train_set: Any, ctx: distributed.Context) -> Plan:
        t = self.cfg.train
        if t.batch_size % ctx.world:
            raise ConfigError(f"train.batch_size {t.batch_size} is not divisible by the {ctx.world} processes")
        per_rank = t.batch_size // ctx.world
        micro = min(t.micro_batch_size or per_rank, per_rank)  # (more than a process's batch: all of it)
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
            run.head_probe = saved.meta.get("head_probe")
        run.objective.to(ctx.device)
        run.compute = ComputeMeter(run.model.config, ctx.device, ctx.world)
        if saved is None:  # before wrapping, which may flatten the parameters (FSDP)
            run.head_probe = probe_head.for_run(self.cfg, run.model, self.sources, run.compute, self.inputs)
            if run.head_probe and run.eval_sets:  # its score, where the fine-tune starts (FSDP's first forward trains)
                run.start_scores = self._evaluate(run, 0)
                run.head_probe["start"] = {s: m["top1"] for s, m in run.start_scores.items() if "top1" in m}
        run.model.set_grad_checkpointing(t.grad_checkpointing)
        run.wrapped = distributed.wrap(run.objective, ctx, inner=run.model)
        run.optimizer = build_optimizer(run.objective, self.cfg.optim)
        run.ema = EMA(run.model, t.ema) if t.ema > 0 else None
        if t.precision == "fp16":
            run.scaler = torch.amp.GradScaler(ctx.device.type)
        run.step_fn = torch.compile(run.wrapped) if t.compile else run.wrapped
        eager_fp32 = ctx.device.type == "cpu" and t.precision == "fp32" and not (t.compile or t.grad_checkpointing or ctx.parallel == "fsdp")
        # rank 0's choice on every process: what its checkpoints record is what each one ran
        run.dense_shapes = distributed.broadcast_object(training.shapes_for_run(run.model, saved.meta if saved else None, eager_fp32), ctx)
        run.compiled_gelu = distributed.broadcast_object(training.gelu_for_run(
            saved.meta if saved else None, ctx.device.type == "cpu" and not t.compile, training.gelu_elements(run.model, run.plan.micro)), ctx)
        eager_onednn = ctx.device.type == "cpu" and not (t.compile or t.grad_checkpointing or ctx.parallel == "fsdp") and (
            t.precision == "bf16" or bool(run.dense_shapes))
        run.packed_dense = distributed.broadcast_object(training.packed_for_run(
            saved.meta if saved else None, eager_onednn, training.dense_elements(run.model, run.plan.micro),
            torch.bfloat16 if t.precision == "bf16" else torch.float32), ctx)
        if ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            self.folder.write_config(self.cfg, self.command)
            if resume_from is not None:  # (saved too)
                report.truncate_after(self.folder.metrics, resume_from)
        distributed.barrier(ctx)
        run.window = new_window()
        if saved is not None:
            note = state.restore_training(saved, run, t.seed)
            if note:
                self._say(f"note: {note}")
            run.window.update(saved.meta.get("log_window", {}))
            done = dict(saved.meta.get("compute", {}))  # the totals so far; rank 0 carries every process's CPU-seconds
            run.compute.load_state_dict({**done, "cpu_s": done.get("cpu_s", 0.0) if ctx.is_main else 0.0})
            run.bad_images.update(saved.meta.get("bad_images", []))
            run.hooks.load(saved.meta.get("callbacks", {}))
            if run.scaler is not None and "grad_scaler" in saved.meta:
                run.scaler.load_state_dict(saved.meta["grad_scaler"])  # its scale is part of exact resume
            self._say(f"resuming {self.out} from step {run.start} of {run.plan.total}")
        elif ctx.rank > 0:
            torch.manual_seed(t.seed + 7919 * ctx.rank)  # different dropout/Mixup draws per process

    # Train --------------------------------------------------------------------------------
    def _train(self, run: Run) -> float:
        """Every step from run.start to the end; returns the training seconds (all sessions)."""
        cfg, t, ctx = self.cfg, self.cfg.train, run.ctx
        if ctx.is_main:
            run.log = MetricsLog(self.out, open_trackers(list(self.trackers), self.out, cfg.to_dict()))
            run.progress = Progress(run.plan.total, run.start, quiet=self.quiet, lr=cfg.optim.lr)
        self._say("\n  ".join((report.plan_line(run, self.cfg), *self.notes, *probe_head.lines(run.head_probe, run.start))))
        # A rate sweep's arm is the first steps of a longer run, warmed up as that run is (finetune_choice.apply).
        if cfg.optim.warmup_steps >= run.plan.total and cfg.origin("optim.warmup_steps") != SWEEP:
            self._warn(f"optim.warmup_steps={cfg.optim.warmup_steps} is not shorter than the run ({run.plan.total} steps): "
                       f"the learning rate never reaches optim.lr={cfg.optim.lr:g} and never decays; lower --warmup-steps")
        for split, metrics in run.start_scores.items() if ctx.is_main else ():  # scored in _restore, logged now
            self._log_eval(run, 0, split, metrics, False)
        loader = train_loader(cfg, run.train_set, run.plan.per_rank, run.start, run.plan.total, ctx)
        t_start = time.perf_counter()
        step = run.start
        run.compute.start()
        # freed activations reused across steps on the CPU (deploy/training.kept_heap)
        with training.kept_heap(ctx.device.type == "cpu"):
            try:
                while step < run.plan.total:
                    images, labels, bad = next(loader)
                    run.bad_images.update(bad)
                    images = model_input(images, ctx.device, run.model.config)  # uint8 normalised here
                    lr = lr_at(step, run.plan.total, cfg.optim)
                    loss, acc = self._step(run, step, images, labels, lr)
                    step += 1
                    self._log_step(run, step, loss, acc, lr, labels.shape[0])
                    if t.eval_every and step % t.eval_every == 0 and step < run.plan.total:
                        self._evaluate(run, step)
                    stop_signal = self.watch.stop_now()  # the same on every process
                    if step % t.ckpt_every == 0 or step == run.plan.total or run.stop or stop_signal:
                        self._save(run, step, run.prior_seconds + time.perf_counter() - t_start)
                    if stop_signal:
                        raise preemption.Preempted(stop_signal, step, run.plan.total, run.last_good, ctx.is_main)
                    if run.stop:
                        self._say(f"{run.stop}; stopping at step {step} of {run.plan.total}")
                        break
            finally:
                run.start = step  # where training ended: the final evaluation's step
                close(loader)  # its workers end here, on every way out (an error, a signal, the end)
                run.compute.pause()
                if run.progress:
                    run.progress.close()
        return run.prior_seconds + time.perf_counter() - t_start

    def _step(self, run: Run, step: int, images: torch.Tensor, labels: torch.Tensor, lr: float) -> tuple[float, float]:
        """One optimiser step over this process's share of the global batch."""
        ctx, optim_cfg = run.ctx, self.cfg.optim
        for g in run.optimizer.param_groups:
            g["lr"] = lr
        run.objective.train()
        n = labels.shape[0]
        chunks = list(zip(images.split(run.plan.micro), labels.split(run.plan.micro), strict=True)) if n else []
        loss_value, acc_value = 0.0, 0.0
        for i, (x, y) in enumerate(chunks):
            x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
            with (distributed.no_sync(run.wrapped, skip=i < len(chunks) - 1), torch.autocast(**self._autocast(ctx)),
                  training.dense_kernels(run.dense_shapes, run.packed_dense), training.fast_gelu(run.compiled_gelu)):
                loss, metrics = run.step_fn(x, y)
                share = loss * (y.shape[0] / n)  # the mean over this process's batch, however split
                (run.scaler.scale(share) if run.scaler else share).backward()
            loss_value += float(loss.detach()) * y.shape[0] / n
            acc_value += float(metrics.get("accuracy", float("nan"))) * y.shape[0] / n
        grad_norm = float("nan")
        if run.scaler is not None:
            run.scaler.unscale_(run.optimizer)  # clip the true gradients, not the scaled ones
        if optim_cfg.clip_grad_norm > 0:
            params = [p for p in run.objective.parameters() if p.requires_grad]
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, optim_cfg.clip_grad_norm))
        # Under fp16 an infinite gradient is the scaler's business (it skips the step and lowers
        # the scale); only a non-finite loss means the run diverged.
        grads_checked = optim_cfg.clip_grad_norm > 0 and run.scaler is None
        bad = not math.isfinite(loss_value) or (grads_checked and not math.isfinite(grad_norm))
        if distributed.any_flag(bad, ctx):
            where = f"the last good checkpoint is {run.last_good}" if run.last_good else "no checkpoint was written yet"
            raise TrainingDiverged(f"step {step + 1}: the loss is {loss_value} (gradient norm {grad_norm}); stopped before updating "
                                   f"the weights, {where}. Lower --lr or lengthen --warmup-steps")
        if run.scaler is not None:
            run.scaler.step(run.optimizer)
            run.scaler.update()
        else:
            run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        if run.ema is not None:
            run.ema.update(run.model)
        return loss_value, acc_value

    def _autocast(self, ctx: distributed.Context) -> dict[str, Any]:
        precision = self.cfg.train.precision
        dtype = torch.float16 if precision == "fp16" else torch.bfloat16
        return dict(device_type=ctx.device.type, dtype=dtype, enabled=precision != "fp32")

    def _log_step(self, run: Run, step: int, loss: float, acc: float, lr: float, n: int) -> None:
        w, t = run.window, self.cfg.train
        w["loss"] += loss
        w["acc"] += acc
        w["n"] += 1
        w["images"] += n * run.ctx.world
        run.compute.step(n * run.ctx.world)
        log_now = step % t.log_every == 0 or step == run.plan.total
        compute = self._compute(run) if log_now else {}
        if run.ctx.is_main:
            rate = w["images"] / max(time.perf_counter() - w["t"], 1e-9)
            if run.progress:
                run.progress.update(step, w["loss"] / w["n"], lr, rate, log_now, last_loss=loss)
            if log_now:
                record = {"step": step, "epoch": round(step / run.plan.per_epoch, 4), "split": "train",
                          "loss": w["loss"] / w["n"], "accuracy": w["acc"] / w["n"], "lr": lr, "images_per_s": round(rate, 2),
                          **{k: compute[k] for k in ("images_seen", "train_flops", "wall_s", "cpu_s", "gpu_s")}}
                assert run.log is not None  # the main process's
                run.log.write(record)
                run.hooks.call("log", step, record)
        if log_now:
            run.window = new_window()

    # Evaluate -----------------------------------------------------------------------------
    def _evaluate(self, run: Run, step: int, final: bool = False) -> dict[str, dict[str, Any]]:
        """Each evaluation split, with the EMA weights when Polyak averaging is on (the last one
        on vitlab's CPU inference path where it applies: objectives.evaluation_target)."""
        ctx, t = run.ctx, self.cfg.train
        fast = final and ctx.world == 1 and ctx.device.type == "cpu" and t.precision == "fp32" and t.objective == "supervised"
        target = evaluation_target(run.objective, run.ema, fast)
        target.eval()
        results = {}
        for split, dataset in run.eval_sets.items():
            loader = make_loader(dataset, t.eval_batch_size or max(t.batch_size // ctx.world, 1), rank=ctx.rank,
                                 world=ctx.world, train=False, num_workers=self.cfg.data.num_workers)
            sums = None
            shown = eval_batches(loader, split, known_length(dataset), quiet=self.quiet or not ctx.is_main)
            with torch.no_grad(), torch.autocast(**self._autocast(ctx)):
                for images, labels, _ in shown:
                    if labels.numel():
                        sums = add_counts(sums, target.eval_step(images.to(ctx.device), labels.to(ctx.device)))
            if sums is None:
                raise ConfigError(f"the {split} split of {self.cfg.data.eval_data or self.cfg.data.name} is empty")
            sums = distributed.sum_tensors({k: v.to(ctx.device) for k, v in sums.items()}, ctx)
            results[split] = target.finish_eval(sums)
            if ctx.is_main and run.log is not None:  # (the start's score comes before the log: _train writes it)
                self._log_eval(run, step, split, results[split], final)
        run.objective.train()
        if not final and step:  # (step 0: the start's score, before any callback's first step)
            run.hooks.call("eval", step, results)
        return results

    def _log_eval(self, run: Run, step: int, split: str, metrics: dict[str, Any], final: bool) -> None:
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        record = {"step": step, "epoch": round(step / run.plan.per_epoch, 4), "split": split, **scalars}
        accuracy = scalars.get("top1", scalars.get("color_acc"))  # what this objective calls accuracy
        if accuracy is not None:
            record["accuracy"] = accuracy
        assert run.log is not None  # called on the main process, which has the log
        run.log.write(record)
        line = f"eval {split} @ step {step}: " + "  ".join(f"{k} {v:.4f}" for k, v in scalars.items() if k != "count")
        if run.progress and not final:
            run.progress.message(line)
        elif not self.quiet:
            LOG.info(line)

    # Save and report ----------------------------------------------------------------------
    def _save(self, run: Run, step: int, seconds: float) -> None:
        info = {"step": step, **run.objective.checkpoint_metadata()}
        partial = {k: run.window[k] for k in ("loss", "acc", "n")}  # the unfinished log window
        done = self._compute(run)
        compute = {**run.compute.state_dict(), "cpu_s": done["cpu_s"]}  # CPU-seconds of every process
        extra = {"total_steps": run.plan.total, "train_seconds": seconds, "log_window": partial, "compute": compute,
                 "bad_images": sorted(run.bad_images), "callbacks": run.hooks.state(), "head_probe": run.head_probe, "dense_kernels": run.dense_shapes,
                 "compiled_gelu": run.compiled_gelu, "packed_dense": run.packed_dense}
        if run.scaler is not None:
            extra["grad_scaler"] = run.scaler.state_dict()
        run.last_good = state.save_checkpoint(self.folder.checkpoints, step, run, info, extra)
        run.hooks.call("checkpoint", step, run.last_good)

    def _compute(self, run: Run) -> dict[str, Any]:
        """The run's compute so far (see train/compute.py); CPU-seconds summed over processes,
        so every process calls this at the same step."""
        totals = run.compute.summary()
        cpu = torch.tensor([totals["cpu_s"]], dtype=torch.float64, device=run.ctx.device)
        totals["cpu_s"] = round(float(distributed.sum_tensors({"cpu": cpu}, run.ctx)["cpu"].item()), 3)
        return totals

    def _finish(self, run: Run, results: dict[str, dict[str, Any]], seconds: float) -> dict[str, Any]:
        names = list(run.model.class_names or ())  # (build_model names the classes)
        bad = set().union(*distributed.gather_objects(sorted(run.bad_images), run.ctx))  # files, not reads
        ckpt = self.folder.checkpoint_file(run_layout.EMA if run.ema is not None else run_layout.LAST)
        splits = report.summary_splits(results, names)
        summary = {
            "model": run.model.config.name, **grid_record(run.model.config),
            "steps": run.plan.total, "epochs": round(run.plan.total / run.plan.per_epoch, 3), "splits": splits,
            "checkpoint": str(ckpt), "ema": self.cfg.train.ema or None, "train_seconds": round(seconds, 1),
            "bad_images_skipped": len(bad), "world_size": run.ctx.world, "compute": self._compute(run),
            **run.hooks.end(run.start), **({"head_probe": run.head_probe} if run.head_probe else {})}
        if run.start < run.plan.total:
            summary.update(steps=run.start, epochs=round(run.start / run.plan.per_epoch, 3),
                           stopped_early={"step": run.start, "reason": run.stop})
        if not run.ctx.is_main:
            return summary
        for warning in probe_head.below_start(run.head_probe, results, run.start, self.cfg):
            self._warn(warning)
        assert run.log is not None  # the main process's
        where = [tracker.where for tracker in run.log.trackers]
        run.log.close()
        atomic_write_text(self.folder.summary, json.dumps(summary, indent=2))
        title = report.run_title(run.model.config.name, self.cfg.data.name, self.out.name)
        notes = report.plot_run(self.folder, results, names, title, self.cfg.train.objective)
        LOG.info(report.final_report(self.folder, summary, results, notes, where, self.cfg))  # --quiet too
        return summary
