"""The training loop: one loop for every objective, recipe and number of processes.

    run = Trainer(config, out="runs/digits").run()

What it does, in order: join the process group (torchrun), seed everything, open the data,
build the model (fresh from a variant, or from a checkpoint for fine-tuning), wrap the
objective for data parallelism, and continue from the newest checkpoint in the run folder
if there is one. Then for each optimiser step: one global batch (split over processes and
micro-batches), the loss, the gradient (clipped at global norm `optim.clip_grad_norm`), the
learning rate of the schedule, the step, the EMA. A non-finite loss stops the run before it
touches the weights, so the last checkpoint stays the last good state.

Exact resume: everything a step depends on is either saved (weights, optimiser, EMA,
Python/NumPy/torch random states) or a function of (seed, step) (the data order and each
image's augmentation, see vitlab.data.loader). On CPU a resumed run's weights are
bit-identical to an uninterrupted run's.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from vitlab.config import ConfigError, RunConfig, ViTConfig
from vitlab.train import distributed, state
from vitlab.train.objectives import Objective, build_objective
from vitlab.train.optim import EMA, build_optimizer, lr_at

# Config keys that may change between a run and its resumption: none of them changes a number.
RESUMABLE_CHANGES = {
    "data.num_workers", "train.log_every", "train.eval_batch_size", "train.keep_checkpoints",
    "train.ckpt_every", "train.device", "train.threads",
}


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the last good checkpoint."""


def model_config(cfg: RunConfig) -> tuple[ViTConfig, Optional[str]]:
    """The architecture a run trains (before the class count is known) and its start checkpoint."""
    from vitlab.api import get_config

    m, checkpoint = dict(cfg.model.changes), cfg.model.checkpoint or None
    if checkpoint:
        from vitlab import checkpoints

        base = checkpoints.read_checkpoint(checkpoint).config
        return base.replace(**m), checkpoint
    return get_config(cfg.model.name, **m), None


def build_model(cfg: RunConfig, num_classes: int, class_names: list[str]) -> nn.Module:
    import vitlab

    m, checkpoint, name = dict(cfg.model.changes), cfg.model.checkpoint, cfg.model.name
    m.setdefault("num_classes", num_classes)
    if checkpoint:
        # Fine-tuning (§3.2): position embeddings resized to the new resolution, the head
        # replaced when the class count changes, pre-logits dropped with representation_size=None.
        model = vitlab.load(checkpoint, **m)
        model.reset_classifier(model.config.num_classes, init="zeros")  # a fresh zero head, always
    else:
        model = vitlab.create_model(name, **m)
    model.class_names = list(class_names)
    return model


def _full(t: torch.Tensor) -> torch.Tensor:
    """A whole tensor on the CPU (gathering an FSDP shard)."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().cpu().contiguous()


def fresh_model(config: ViTConfig) -> nn.Module:
    """A model to copy weights into. Built with the random state put back afterwards: its
    initialisation must not shift the run's random stream (exact resume)."""
    from vitlab.models.vit import VisionTransformer

    with torch.random.fork_rng(devices=[]):
        return VisionTransformer(config)


def enable_grad_checkpointing(model: nn.Module) -> None:
    """Recompute each encoder block in the backward pass instead of storing its activations.
    The wrapper is set on the instances' `forward`: parameter names (the checkpoint contract)
    do not change. Dropout masks are replayed (torch saves the random state)."""
    import functools

    from torch.utils.checkpoint import checkpoint

    for block in model.blocks:
        plain = block.forward

        def forward(*args, _plain=plain, **kwargs):
            if torch.is_grad_enabled():
                return checkpoint(_plain, *args, use_reentrant=False, **kwargs)
            return _plain(*args, **kwargs)

        block.forward = functools.update_wrapper(forward, plain)


class Trainer:
    def __init__(self, config: RunConfig, out: str | Path, command: str = "", quiet: bool = False):
        self.cfg = config
        self.out = Path(out)
        self.command = command
        self.quiet = quiet

    # Run folder ---------------------------------------------------------------------------
    def _check_folder(self) -> str:
        """'new', 'resume' or 'done'; refuses a folder holding something else."""
        import yaml

        cfg_file = self.out / "config.yaml"
        if not self.out.exists() or (self.out.is_dir() and not any(self.out.iterdir())):
            return "new"
        if not self.out.is_dir():
            raise ConfigError(f"--out {self.out} is a file; give a folder for the run")
        if not cfg_file.exists():
            raise ConfigError(
                f"{self.out} exists and is not a vitlab run folder (no config.yaml); refusing to write into it: "
                "choose a new --out folder"
            )
        old = RunConfig.from_dict(yaml.safe_load(cfg_file.read_text())).to_dict()
        new = self.cfg.to_dict()
        diffs = [
            f"{s}.{k}: {old[s].get(k)!r} -> {new[s].get(k)!r}"
            for s in new
            for k in sorted(set(old[s]) | set(new[s]))
            if old[s].get(k) != new[s].get(k) and f"{s}.{k}" not in RESUMABLE_CHANGES
        ]
        if diffs:
            raise ConfigError(
                f"{self.out} holds a run with a different config ({'; '.join(diffs[:6])}); "
                "its outputs are kept: use another --out to start a new run, or the same settings to continue it"
            )
        return "resume"

    def _write_config(self) -> None:
        import yaml

        from vitlab.checkpoints.io import atomic_write

        header = "# Resolved config of this run (vitlab train --config this-file reruns it)\n"
        if self.command:
            header += f"# command: {self.command}\n"
        text = header + yaml.safe_dump(self.cfg.to_dict(), sort_keys=False)
        atomic_write(self.out / "config.yaml", lambda tmp: Path(tmp).write_text(text))

    # Data -----------------------------------------------------------------------------------
    def _open(self, spec: str, split: str, train: bool, mcfg: ViTConfig):
        from vitlab.data import open_dataset

        d = self.cfg.data
        options = dict(
            crop_scale=d.crop_scale, crop_ratio=d.crop_ratio, hflip=d.hflip, randaugment=d.randaugment,
            randaugment_magnitude=d.randaugment_magnitude, dev_fraction=d.dev_fraction,
            skip_bad_images=d.skip_bad_images, shuffle_buffer=d.shuffle_buffer,
        )
        if spec.startswith("wds:") and d.classes:
            options["classes"] = list(d.classes)
        return open_dataset(
            spec, split, image_size=mcfg.image_size, in_channels=mcfg.in_channels, mean=mcfg.mean, std=mcfg.std,
            train=train, seed=self.cfg.train.seed, **options,
        )

    # The run ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t = self.cfg.train
        ctx = distributed.setup(t.device, t.parallel)
        self.ctx = ctx
        try:
            return self._run(ctx)
        finally:
            distributed.cleanup(ctx)

    def _say(self, text: str) -> None:
        if self.ctx.is_main and not self.quiet:
            print(text, flush=True)

    def _run(self, ctx: distributed.Context) -> dict[str, Any]:
        from vitlab.data import make_loader
        from vitlab.data.loader import batches_per_epoch

        cfg, t = self.cfg, self.cfg.train
        mode: Any = None
        if ctx.is_main:
            try:
                mode = self._check_folder()
            except ConfigError as e:  # every process must hear of it, or the others would wait
                mode = e
        mode = distributed.broadcast_object(mode, ctx)
        if isinstance(mode, Exception):
            raise mode
        if t.threads:
            torch.set_num_threads(t.threads)
        random.seed(t.seed)
        np.random.seed(t.seed)
        torch.manual_seed(t.seed)

        # Data and model.
        mcfg, _ = model_config(cfg)
        train_set = self._open(cfg.data.name, cfg.data.train_split, True, mcfg)
        eval_spec = cfg.data.eval_data or cfg.data.name
        eval_sets = {s: self._open(eval_spec, s, False, mcfg) for s in cfg.data.eval_splits}
        class_names = train_set.class_names
        model = build_model(cfg, len(class_names), class_names)
        if model.config.num_classes != len(class_names):
            raise ConfigError(
                f"model.num_classes={model.config.num_classes} but {cfg.data.name} has {len(class_names)} classes"
            )
        objective = build_objective(model, cfg)

        if t.batch_size % ctx.world:
            raise ConfigError(f"train.batch_size {t.batch_size} is not divisible by the {ctx.world} processes")
        per_rank = t.batch_size // ctx.world
        micro = t.micro_batch_size or per_rank
        if per_rank % micro:
            raise ConfigError(
                f"the per-process batch {per_rank} is not a multiple of train.micro_batch_size {micro}"
            )
        bpe = batches_per_epoch(train_set, t.batch_size)
        if bpe < 1:
            raise ConfigError(f"train.batch_size {t.batch_size} exceeds the {len(train_set)} training images")
        total = t.steps or math.ceil(t.epochs * bpe)
        if total < 1:
            raise ConfigError("set train.steps (--steps) or train.epochs (--epochs)")

        ckpt_dir = self.out / "checkpoints"
        start = 0
        resume_from = state.latest(ckpt_dir) if mode == "resume" else None
        if mode == "resume" and resume_from is None and ctx.is_main:
            # Died before its first checkpoint: start again, dropping its partial metrics.
            from vitlab.train.report import truncate_after

            truncate_after(self.out / "metrics.jsonl", 0)
        summary_file = self.out / "summary.json"
        if resume_from == total and summary_file.exists():
            self._say(f"{self.out}: this run is already complete ({total} steps); its results are in {summary_file}")
            return json.loads(summary_file.read_text())

        # Weights first (plain modules), then wrapping, then the optimiser.
        prior_seconds = 0.0
        loaded_state = None
        if resume_from is not None:
            from vitlab import checkpoints

            model_file, state_file = state.step_paths(ckpt_dir, resume_from)
            imported = checkpoints.read_checkpoint(model_file)
            model.load_state_dict(imported.state)
            objective.load_extra_tensors(imported.extras)
            loaded_state = state.read_state(state_file)
            start = resume_from
            prior_seconds = float(loaded_state[1].get("train_seconds", 0.0))
        objective.to(ctx.device)
        if t.grad_checkpointing:
            enable_grad_checkpointing(model)
        wrapped = distributed.wrap(objective, ctx, blocks=list(model.blocks), inner=model)
        optimizer = build_optimizer(objective, cfg.optim)
        ema = EMA(model, t.ema) if t.ema > 0 else None
        step_fn = torch.compile(wrapped) if t.compile else wrapped

        if ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            self._write_config()
            if resume_from is not None:
                from vitlab.train.report import truncate_after

                truncate_after(self.out / "metrics.jsonl", resume_from)
        distributed.barrier(ctx)

        if loaded_state is not None:
            tensors, meta = loaded_state
            opt_tensors = {k: v for k, v in tensors.items() if k.startswith("optim.")}
            distributed.load_optimizer_state(
                objective, optimizer, state.unflatten_optimizer(opt_tensors, meta["optimizer"]), ctx
            )
            if ema is not None:
                for k in ema.shadow:
                    ema.shadow[k].copy_(tensors[f"ema.{k}"])
                ema.updates = int(meta["ema_updates"])
            rank_key = f"rank{ctx.rank}." if meta.get("world", 1) == ctx.world else None
            if rank_key is None:
                self._say(f"note: resuming on {ctx.world} processes a run saved on {meta.get('world')}: random states reseeded")
                torch.manual_seed(t.seed + start)
            else:
                rng_t = {k[len("rng." + rank_key) :]: v for k, v in tensors.items() if k.startswith("rng." + rank_key)}
                state.restore_rng(rng_t, meta["rng"][ctx.rank])
            self._say(f"resuming {self.out} from step {start} of {total}")
        elif ctx.rank > 0:
            torch.manual_seed(t.seed + 7919 * ctx.rank)  # different dropout/Mixup draws per process

        from vitlab.train.report import MetricsLog, Progress

        log = MetricsLog(self.out) if ctx.is_main else None
        progress = Progress(total, start) if ctx.is_main and not self.quiet else None
        if ctx.is_main and not self.quiet:
            n_params, mc = sum(p.numel() for p in model.parameters()), model.config
            self._say(
                f"training {model.config.name} [width {mc.hidden_size}, depth {mc.depth}, {mc.image_size[0]}x{mc.image_size[1]} px, "
                f"patch {mc.patch_size}] ({n_params:,} parameters) on {cfg.data.name}: {len(train_set):,} images, "
                f"{len(class_names)} classes, {total} steps of {t.batch_size} ({bpe} per epoch), "
                f"{ctx.world} process(es) on {ctx.device}"
            )
        autocast = dict(device_type=ctx.device.type, dtype=torch.bfloat16, enabled=t.precision == "bf16")
        params = [p for p in objective.parameters() if p.requires_grad]

        def save(step: int, seconds: float) -> Path:
            partial = {k: window[k] for k in ("loss", "acc", "n")}  # the unfinished log window
            return self._save(step, model, objective, optimizer, ema, ctx, ckpt_dir, seconds, total, partial)

        loader_iter = iter(make_loader(
            train_set, per_rank, seed=t.seed, rank=ctx.rank, world=ctx.world, train=True,
            start_step=start, num_steps=total - start, num_workers=cfg.data.num_workers,
        ))
        window = {"loss": 0.0, "acc": 0.0, "n": 0, "images": 0, "t": time.perf_counter()}
        if loaded_state is not None:
            window.update(loaded_state[1].get("log_window", {}))
        bad_images = 0
        t_start = time.perf_counter()
        step = start
        last_good = state.step_paths(ckpt_dir, resume_from)[0] if resume_from is not None else None
        try:
            while step < total:
                images, labels, bad = next(loader_iter)
                bad_images += bad
                lr = lr_at(step, total, cfg.optim)
                for g in optimizer.param_groups:
                    g["lr"] = lr
                objective.train()
                n = labels.shape[0]
                chunks = list(zip(images.split(micro), labels.split(micro))) if n else []
                loss_value, acc_value = 0.0, 0.0
                for i, (x, y) in enumerate(chunks):
                    x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
                    with distributed.no_sync(wrapped, skip=i < len(chunks) - 1), torch.autocast(**autocast):
                        loss, metrics = step_fn(x, y)
                        # Mean over this process's batch, whatever the micro-batch split.
                        (loss * (y.shape[0] / n)).backward()
                    loss_value += float(loss.detach()) * y.shape[0] / n
                    acc_value += float(metrics.get("accuracy", float("nan"))) * y.shape[0] / n
                grad_norm = float("nan")
                if cfg.optim.clip_grad_norm > 0:
                    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.optim.clip_grad_norm))
                bad_step = not math.isfinite(loss_value) or (cfg.optim.clip_grad_norm > 0 and not math.isfinite(grad_norm))
                if distributed.any_flag(bad_step, ctx):
                    where = f"the last good checkpoint is {last_good}" if last_good else "no checkpoint was written yet"
                    raise TrainingDiverged(
                        f"step {step + 1}: the loss is {loss_value} (gradient norm {grad_norm}); stopped before "
                        f"updating the weights, {where}. Lower optim.lr, lengthen optim.warmup_steps or keep "
                        "optim.clip_grad_norm=1"
                    )
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if ema is not None:
                    ema.update(model)
                step += 1

                window["loss"] += loss_value
                window["acc"] += acc_value
                window["n"] += 1
                window["images"] += n * ctx.world
                log_now = step % t.log_every == 0 or step == total
                if ctx.is_main:
                    elapsed = time.perf_counter() - window["t"]
                    rate = window["images"] / max(elapsed, 1e-9)
                    if progress:
                        progress.update(step, loss_value, lr, rate, log_now)
                    if log_now:
                        log.write({
                            "step": step, "epoch": round(step / bpe, 4), "split": "train",
                            "loss": window["loss"] / window["n"], "accuracy": window["acc"] / window["n"],
                            "lr": lr, "images_per_s": round(rate, 2),
                        })
                if log_now:
                    window = {"loss": 0.0, "acc": 0.0, "n": 0, "images": 0, "t": time.perf_counter()}
                if t.eval_every and step % t.eval_every == 0 and step < total:
                    self._evaluate(objective, ema, eval_sets, ctx, step, bpe, log, progress)
                if step % t.ckpt_every == 0 or step == total:
                    last_good = save(step, prior_seconds + time.perf_counter() - t_start)
        finally:
            if progress:
                progress.close()
        train_seconds = prior_seconds + time.perf_counter() - t_start
        results = self._evaluate(objective, ema, eval_sets, ctx, step, bpe, log, None, final=True)
        bad_total = distributed.sum_tensors({"bad": torch.tensor([float(bad_images)], device=ctx.device)}, ctx)["bad"]
        summary = self._finish(results, total, bpe, train_seconds, int(bad_total.item()), ema, log, class_names)
        return summary

    # Pieces --------------------------------------------------------------------------------
    def _save(self, step, model, objective, optimizer, ema, ctx, ckpt_dir, seconds, total, log_window) -> Path:
        from vitlab.checkpoints.io import write as write_model

        model_state = {k: _full(v) for k, v in model.state_dict().items()}
        extras = {k: _full(v) for k, v in objective.extra_tensors().items()}
        opt = distributed.full_optimizer_state(objective, optimizer, ctx)
        rng_t, rng_meta = state.capture_rng()
        all_rng = distributed.gather_objects((rng_t, rng_meta), ctx)
        ema_state = {k: _full(v) for k, v in ema.state_dict().items()} if ema is not None else {}
        model_file, state_file = state.step_paths(ckpt_dir, step)
        if ctx.is_main:
            opt_t, opt_meta = state.flatten_optimizer(opt)
            tensors = dict(opt_t)
            for r, (rt, _) in enumerate(all_rng):
                tensors.update({f"rng.rank{r}.{k}": v for k, v in rt.items()})
            tensors.update({f"ema.{k}": v for k, v in ema_state.items()})
            meta = {
                "step": step, "total_steps": total, "world": ctx.world, "optimizer": opt_meta,
                "rng": [m for _, m in all_rng], "ema_updates": ema.updates if ema else 0, "train_seconds": seconds,
                "log_window": log_window,
            }
            state.write_state(state_file, tensors, meta)
            to_save = model
            if ctx.parallel == "fsdp":  # a plain copy holding the gathered weights
                to_save = fresh_model(model.config)
                to_save.load_state_dict(model_state)
                to_save.class_names = model.class_names
            info = {"step": step, "objective": self.cfg.train.objective, "objective_options": self.cfg.objective.to_dict()}
            write_model(to_save, model_file, extra_metadata=info, extra_tensors=extras)
            state.link_last(ckpt_dir, model_file)
            if ema is not None:
                averaged = fresh_model(model.config)
                averaged.load_state_dict({**model_state, **{k: v.to(model_state[k].dtype) for k, v in ema_state.items()}})
                averaged.class_names = model.class_names
                write_model(averaged, ckpt_dir / "ema.safetensors", extra_metadata={**info, "ema": self.cfg.train.ema})
            state.prune(ckpt_dir, self.cfg.train.keep_checkpoints)
        distributed.barrier(ctx)
        return model_file

    def _evaluate(self, objective: Objective, ema, eval_sets, ctx, step, bpe, log, progress, final=False) -> dict:
        """Each evaluation split, with the EMA weights when Polyak averaging is on."""
        import copy

        from vitlab.data import make_loader
        from vitlab.eval.accuracy import add_counts

        t = self.cfg.train
        target = objective
        if ema is not None:
            target = copy.deepcopy(objective)
            ema.copy_to(target.model)
        target.eval()
        autocast = dict(device_type=ctx.device.type, dtype=torch.bfloat16, enabled=t.precision == "bf16")
        results = {}
        for split, dataset in eval_sets.items():
            loader = make_loader(
                dataset, t.eval_batch_size or max(t.batch_size // ctx.world, 1), rank=ctx.rank, world=ctx.world,
                train=False, num_workers=self.cfg.data.num_workers,
            )
            sums = None
            with torch.no_grad(), torch.autocast(**autocast):
                for images, labels, _ in loader:
                    if labels.numel():
                        sums = add_counts(sums, target.eval_step(images.to(ctx.device), labels.to(ctx.device)))
            if sums is None:
                raise ConfigError(f"the {split} split of {self.cfg.data.eval_data or self.cfg.data.name} is empty")
            sums = distributed.sum_tensors({k: v.to(ctx.device) for k, v in sums.items()}, ctx)
            metrics = target.finish_eval(sums)
            results[split] = metrics
            if ctx.is_main:
                scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                record = {"step": step, "epoch": round(step / bpe, 4), "split": split, **scalars}
                if "top1" in scalars:
                    record["accuracy"] = scalars["top1"]
                log.write(record)
                line = f"eval {split} @ step {step}: " + "  ".join(
                    f"{k} {v:.4f}" for k, v in scalars.items() if k != "count"
                )
                if progress:
                    progress.message(line)
                elif not self.quiet:
                    print(line, flush=True)
        objective.train()
        return results

    def _finish(self, results, total, bpe, seconds, bad_images, ema, log, class_names) -> dict[str, Any]:
        from vitlab.checkpoints.io import atomic_write

        ckpt = self.out / "checkpoints" / ("ema.safetensors" if ema is not None else "last.safetensors")
        splits = {}
        for split, m in results.items():
            entry = {k: v for k, v in m.items() if k not in ("confusion",)}
            if "per_class" in entry and isinstance(entry["per_class"], list):
                entry["per_class"] = dict(zip(class_names, entry["per_class"]))
            splits[split] = entry
        summary = {
            "steps": total,
            "epochs": round(total / bpe, 3),
            "splits": splits,
            "checkpoint": str(ckpt),
            "ema": self.cfg.train.ema or None,
            "train_seconds": round(seconds, 1),
            "bad_images_skipped": bad_images,
            "world_size": self.ctx.world,
        }
        if not self.ctx.is_main:
            return summary
        log.close()
        atomic_write(self.out / "summary.json", lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2)))
        from vitlab.train.report import plot_learning_curve

        notes = [n for n in (plot_learning_curve(self.out / "metrics.jsonl", self.out / "learning_curve.png"), log.tb_note) if n]
        for split, m in results.items():
            if "confusion" in m:
                from vitlab.eval.accuracy import plot_confusion

                plot_confusion(m["confusion"], class_names, self.out / f"confusion_{split}.png")
        if not self.quiet:
            lines = [f"done: {total} steps in {seconds:.1f} s"]
            for split, m in results.items():
                if "top1" in m:
                    lines.append(f"  {split}: top-1 {m['top1']:.2%}  top-5 {m['top5']:.2%}  loss {m['loss']:.4f}")
            if bad_images:
                lines.append(f"  skipped {bad_images} unreadable images (--skip-bad-images)")
            lines += [
                f"outputs in {self.out}/:",
                f"  checkpoint      {ckpt}",
                f"  summary         {self.out / 'summary.json'}",
                f"  metrics         {self.out / 'metrics.jsonl'}",
                f"  config          {self.out / 'config.yaml'}",
            ]
            if (self.out / "learning_curve.png").exists():
                lines.append(f"  learning curve  {self.out / 'learning_curve.png'}")
            if (self.out / "tensorboard").exists():
                lines.append(f"  tensorboard     tensorboard --logdir {self.out / 'tensorboard'}")
            lines += [f"  note: {n}" for n in notes]
            print("\n".join(lines), flush=True)
        return summary
