"""Training state on disk without pickle: tensors in safetensors, everything else in JSON.

A checkpoint at step N is two files, each written atomically (temporary file + rename):

    step-0000N.safetensors         the model in vitlab's checkpoint format (vitlab.load reads it),
                                   with the objective's extra tensors under "objective."
    step-0000N.state.safetensors   optimiser state, EMA weights, random states; the step, the
                                   optimiser's hyper-parameters and the RNG states that are not
                                   tensors are JSON in the file's metadata

plus `last.safetensors`, a hard link to the newest model file. The state file is written
first and the model file last, so a checkpoint is complete when its model file exists; a
crash at any point leaves the previous complete checkpoint untouched. Reading never
unpickles: safetensors holds only tensors, and JSON only primitives.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from vitlab.checkpoints import io
from vitlab.config.fields import is_digits
from vitlab.files import atomic_write, require_regular_file
from vitlab.run_layout import EMA, LAST
from vitlab.train import distributed

STEP_FILE = re.compile(r"^step-(\d+)\.safetensors$")


# Random states ---------------------------------------------------------------------------
def capture_rng(device: torch.device) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Python, NumPy, torch CPU generator states, and the generator of the process's own GPU
    when it trains on one, as (tensors, JSON-able). Only its own: a process draws on no other
    GPU, and restoring the states of every GPU it could see fails where fewer are visible (a
    run saved by torchrun, where each process sees the node's 8, resumed by srun
    --gpus-per-task, where each sees one: "invalid device ordinal")."""
    tensors = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        tensors["cuda"] = torch.cuda.get_rng_state(device)
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["numpy"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    meta = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, int(pos), int(has_gauss), float(cached)],
    }
    return tensors, meta


def restore_rng(tensors: dict[str, Tensor], meta: dict[str, Any], device: torch.device) -> None:
    """The states `capture_rng` took; the GPU generator's into this process's own GPU (a run
    saved on the CPU, or resumed on it, has none to restore)."""
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and device.type == "cuda":
        torch.cuda.set_rng_state(tensors["cuda"], device)
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, tensors["numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))


# Optimiser state ---------------------------------------------------------------------------
def flatten_optimizer(state: dict) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """torch's optimiser state dict -> tensors "optim.KEY.NAME" + JSON for the rest."""
    tensors, scalars = {}, {}
    for key, per_param in state["state"].items():
        for name, value in per_param.items():
            if isinstance(value, Tensor):
                tensors[f"optim.{key}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{key}.{name}"] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def unflatten_optimizer(tensors: dict[str, Tensor], meta: dict[str, Any]) -> dict:
    def key_of(k: str) -> Any:
        return int(k) if is_digits(k) else k

    state: dict[Any, dict[str, Any]] = {}
    for full, value in tensors.items():
        key, name = full[len("optim.") :].rsplit(".", 1)
        state.setdefault(key_of(key), {})[name] = value
    for full, value in meta["scalars"].items():
        key, name = full.rsplit(".", 1)
        state.setdefault(key_of(key), {})[name] = value
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


# Files -------------------------------------------------------------------------------------
def step_paths(folder: Path, step: int) -> tuple[Path, Path]:
    return folder / f"step-{step:08d}.safetensors", folder / f"step-{step:08d}.state.safetensors"


def write_state(path: Path, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    metadata = {"format": "vitlab-train-state", "state": json.dumps(meta)}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def read_state(path: Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != "vitlab-train-state":
                raise io.CheckpointError(f"{path}: not a vitlab training-state file")
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        return tensors, json.loads(meta["state"])
    except io.CheckpointError:
        raise
    except Exception as e:
        raise io.CheckpointError(f"{path}: unreadable training state ({type(e).__name__}: {e})") from None


def link_last(folder: Path, model_file: Path, name: str = LAST) -> None:
    """Point `name` at `model_file` atomically (hard link, or a copy where links fail)."""
    def link(tmp: str) -> None:
        os.unlink(tmp)  # (atomic_write's empty temporary: a link needs the name free)
        try:
            os.link(model_file, tmp)
        except OSError:
            shutil.copyfile(model_file, tmp)

    atomic_write(folder / name, link)


def complete_steps(folder: Path) -> list[int]:
    """Steps with both files present, oldest first."""
    found = [int(m.group(1)) for p in (folder.iterdir() if folder.is_dir() else ()) if (m := STEP_FILE.match(p.name))]
    return sorted(step for step in found if step_paths(folder, step)[1].exists())


def prune(folder: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints (and whatever last.safetensors points to)."""
    for step in complete_steps(folder)[:-keep]:
        for p in step_paths(folder, step):
            p.unlink(missing_ok=True)


def damage(path: Path) -> Optional[str]:
    """What is wrong with a safetensors file, or None if it is whole: the 8-byte header
    length, the JSON header, and a file size equal to the end of the last tensor (a truncated
    copy or a disk that filled up fails here without reading the tensors)."""
    try:
        with open(require_regular_file(path), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 0 or n > size - 8:
                return f"truncated ({size} bytes, not even its header)"
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as e:
        return f"unreadable ({type(e).__name__}: {e})"
    if 8 + n + end != size:
        return f"truncated ({size:,} bytes of {8 + n + end:,})"
    return None


def latest(folder: Path) -> Optional[int]:
    """The newest checkpoint whose two files are whole. A damaged newer one is skipped, with
    a warning that names it (it stays on disk, and is overwritten when the run gets there)."""
    for step in reversed(complete_steps(folder)):
        problems = [f"{p.name} is {why}" for p in step_paths(folder, step) if (why := damage(p))]
        if not problems:
            return step
        if distributed.is_main_process():
            warnings.warn(f"{folder}: the checkpoint of step {step} is damaged ({'; '.join(problems)}); "
                          "falling back to the newest intact checkpoint before it", stacklevel=2)
    return None


# A whole checkpoint ------------------------------------------------------------------------
@dataclass
class Saved:
    """What a training-state file gives back: its tensors and its JSON."""

    step: int
    tensors: dict[str, Tensor]
    meta: dict[str, Any]


def save_checkpoint(folder: Path, step: int, run: Any, info: dict[str, Any], extra_meta: dict[str, Any]) -> Path:
    """Write the checkpoint of `step`: the state file, then the model file (and the EMA
    weights), then point last.safetensors at it and prune old ones. Every process calls this
    (gathering FSDP shards and random states is collective); only rank 0 writes.

    `run` holds model, objective, optimizer, ema and ctx; `info` goes into the model file's
    metadata, `extra_meta` into the state file's JSON."""
    ctx, ema = run.ctx, run.ema
    model_state = distributed.full_tensors(run.model.state_dict())
    extras = distributed.full_tensors(run.objective.extra_tensors())
    optimizer = distributed.full_optimizer_state(run.objective, run.optimizer, ctx)
    rng = distributed.gather_objects(capture_rng(ctx.device), ctx)
    ema_state = distributed.full_tensors(ema.state_dict()) if ema is not None else {}
    model_file, state_file = step_paths(folder, step)
    if ctx.is_main:
        opt_tensors, opt_meta = flatten_optimizer(optimizer)
        tensors = dict(opt_tensors)
        for r, (rank_tensors, _) in enumerate(rng):
            tensors.update({f"rng.rank{r}.{k}": v for k, v in rank_tensors.items()})
        tensors.update({f"ema.{k}": v for k, v in ema_state.items()})
        meta = {
            "step": step, "world": ctx.world, "optimizer": opt_meta, "rng": [m for _, m in rng],
            "ema_updates": ema.updates if ema is not None else 0, **extra_meta,
        }
        write_state(state_file, tensors, meta)
        config, names = run.model.config, run.model.class_names
        io.write_state(config, model_state, names, model_file, extra_metadata=info, extra_tensors=extras)
        link_last(folder, model_file)
        if ema is not None:
            averaged = {**model_state, **{k: v.to(model_state[k].dtype) for k, v in ema_state.items()}}
            io.write_state(config, averaged, names, folder / EMA, extra_metadata={**info, "ema": ema.decay})
        prune(folder, run.cfg.train.keep_checkpoints)
    distributed.barrier(ctx)
    return model_file


def load_weights(folder: Path, step: int, model: torch.nn.Module, objective: Any) -> Saved:
    """Put the weights of checkpoint `step` into the (unwrapped) model and objective; returns
    the training state, to be restored once the optimiser exists (`restore_training`)."""
    model_file, state_file = step_paths(folder, step)
    imported = io.read(model_file)
    model.load_state_dict(imported.state)
    objective.load_extra_tensors(imported.extras)
    tensors, meta = read_state(state_file)
    return Saved(step, tensors, meta)


def restore_training(saved: Saved, run: Any, seed: int) -> Optional[str]:
    """Optimiser, EMA and random states from `saved`; returns a note when the random states
    had to be reseeded (a run saved on another number of processes)."""
    ctx, tensors, meta = run.ctx, saved.tensors, saved.meta
    opt_tensors = {k: v for k, v in tensors.items() if k.startswith("optim.")}
    optimizer_state = unflatten_optimizer(opt_tensors, meta["optimizer"])
    distributed.load_optimizer_state(run.objective, run.optimizer, optimizer_state, ctx)
    if run.ema is not None:
        for k in run.ema.shadow:
            run.ema.shadow[k].copy_(tensors[f"ema.{k}"])
        run.ema.updates = int(meta["ema_updates"])
    if meta.get("world", 1) != ctx.world:
        torch.manual_seed(seed + saved.step)
        return f"resuming on {ctx.world} processes a run saved on {meta.get('world')}: random states reseeded"
    prefix = f"rng.rank{ctx.rank}."
    restore_rng({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}, meta["rng"][ctx.rank], ctx.device)
    return None
