"""VTAB-1k fine-tuning and its Table 9 row (the paper's Table 2 VTAB column, Fig. 2, Table 9).

The paper's VTAB setting (Appendix B.1.1, Table 4): one setting for every task, 2,500 steps
at learning rate 0.01, with the fine-tuning recipe's SGD (momentum 0.9, cosine decay, no
weight decay, clipping at 1, batch 512, warm-up 500 steps), at the paper's fine-tuning
resolution of 384 (Appendix B.1.1; `Settings.image_size`), trained on each task's 1,000
examples and evaluated on its full test split. The paper chose that setting by a small sweep
on the 200-example val sets; `Settings.grid` runs such a sweep per task (train on the 800,
score on the 200, then rerun the best rate on all 1,000). VTAB-1k's fine-tuning uses no
augmentation: as task_adaptation's data_loader, every image is resized whole to the square
(data.crop=whole: no crop, no flip), the geometry of evaluation; a flip changes the label of
dSprites orientation, a crop that of dSprites location, of KITTI's distance and CLEVR's count.

Each task writes OUT/TASK/ (its run folder, or sweep/ and final/) and, when done,
OUT/TASK/result.json with the identity of its work (files.identity: the checkpoint's sha256
and the task's resolved settings); a task with a result is not run again when that identity
is the one asked for now, is refused by name when it is not (another checkpoint, other
settings), and an interrupted one resumes from its checkpoint. The table is made from every
result.json under OUT, checked the same way, so tasks run as separate jobs (sweep/vtab.py)
add up to one row and a row never names results of other work. A task whose data is absent is listed with
where to put it and counted as absent, never left out of the mean silently: the mean then
says over how many of the tasks it is taken.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from vitlab import checkpoints
from vitlab.config import ConfigError, RunConfig, parse_override
from vitlab.config.fields import number
from vitlab.config.model import grid_note
from vitlab.config.provenance import COMMAND_LINE, VTAB
from vitlab.data import DataError
from vitlab.data.vtab import GROUPS, TASKS, Task, get_task, group_sizes, mean
from vitlab.data.vtab_sources import describe, locate, where_to_put
from vitlab.files import OutputFolder, atomic_write_text
from vitlab.files.documents import Number, read_json
from vitlab.files.identity import differences, work_identity
from vitlab.run_layout import holding_run
from vitlab.tables import csv_table, markdown_table
from vitlab.train import distributed, finetune_choice as choice
from vitlab.train.build import architecture
from vitlab.train.finetune import RECIPE, TABLE4_STEPS, lr_grid
from vitlab.train.inputs import Inputs
from vitlab.train.run_folder import RESUMABLE_CHANGES

VTAB_LR = 0.01  # Table 4
VTAB_WARMUP = 500  # the fine-tuning recipe's warm-up (at most a fifth of a shorter run)
VTAB_IMAGE_SIZE = 384  # the paper fine-tunes every task at 384 (Appendix B.1.1)
TrainFn = Callable[[RunConfig, Path, Inputs], dict[str, Any]]  # one run, reading the suite's inputs


# The keys vitlab vtab sets from its own flags: an override of one would silently beat the flag.
FLAGS = {"train.steps": "--steps", "optim.lr": "--lr (or --lr-grid)", "train.batch_size": "--batch-size",
         "model.image_size": "--image-size", "train.seed": "--seed", "train.device": "--device"}


@dataclass(frozen=True)
class Settings:
    steps: int = TABLE4_STEPS["vtab"]
    lr: Optional[float] = None  # None: VTAB_LR, or the grid's choice
    batch_size: int = 512
    grid: Optional[Sequence[float]] = None  # learning rates to choose from on the 200-example val set; None = lr
    image_size: Optional[int] = VTAB_IMAGE_SIZE  # None: the checkpoint's own
    seed: int = 0
    device: str = "auto"
    overrides: tuple[str, ...] = ()  # SECTION.KEY=VALUE, applied last
    # TASK=[CONFIG/]VERSION: a tfds copy read instead of the one VTAB pins (recorded in results)
    accept: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        accepted: dict[str, str] = {}
        for a in self.accept:
            name, sep, version = a.partition("=")
            if not sep or not version:
                raise DataError(f"--tfds-version {a!r}: write TASK=[CONFIG/]VERSION, e.g. pets=4.0.0")
            get_task(name)  # (an unknown task is refused with the list of them)
            if accepted.setdefault(name, version) != version:  # one version per task: the last would win silently
                raise DataError(f"--tfds-version gives {name} two versions ({name}={accepted[name]} and {a}): give one")
        if self.grid is not None:
            lr_grid(None, self.grid)  # an empty or non-positive grid, refused
            object.__setattr__(self, "grid", tuple(self.grid))  # kept as given otherwise: Settings(**vars(s)) == s
        if self.grid is not None and self.lr is not None:
            raise ConfigError("--lr and --lr-grid both set the learning rate (--lr-grid chooses it per task): give one")
        keys = [parse_override(o)[0] for o in self.overrides]
        flagged = [f"{o} (vitlab vtab sets it with {FLAGS[k]})" for o, k in zip(self.overrides, keys, strict=True) if k in FLAGS]
        if flagged:  # the override would win over the flag without a word
            raise ConfigError(f"{'; '.join(flagged)}: give it with the flag")

    @property
    def rate(self) -> float:
        """The learning rate of a run without a grid (and the grid's runs' starting config)."""
        return VTAB_LR if self.lr is None else self.lr

    def accepted(self, task: Task) -> str:
        """The tfds [CONFIG/]VERSION accepted for `task` instead of VTAB's pin ("" for none)."""
        return dict(a.partition("=")[::2] for a in self.accept).get(task.name, "")


def image_size(text: str) -> Optional[int]:
    """--image-size: pixels, or "checkpoint" (None: the checkpoint's own resolution)."""
    if text == "checkpoint":
        return None
    try:
        return int(number(text, "--image-size", whole=True, at_least=1))
    except ConfigError:
        raise DataError(f"--image-size {text!r}: give a number of pixels (the paper's 384), or checkpoint") from None


def task_config(checkpoint: str, task: Task, root: Path, s: Settings, inputs: Inputs) -> RunConfig:
    """The fine-tuning run of one task: the finetune recipe with the VTAB setting."""
    changes: dict[str, Any] = {
        "model.checkpoint": checkpoint, "data.eval_data": "",
        "data.name": f"vtab:{task.name}{'@' + s.accepted(task) if s.accepted(task) else ''}:{root}",
        "data.train_split": "train", "data.eval_splits": ["test"], "data.crop": "whole",
        "data.hflip": False, "train.steps": s.steps, "train.epochs": 0.0,
        "train.batch_size": s.batch_size, "train.seed": s.seed, "train.device": s.device, "optim.lr": s.rate,
        "optim.warmup_steps": min(VTAB_WARMUP, max(1, s.steps // 5)), "train.ckpt_every": max(1, min(500, s.steps)),
    }
    if s.image_size:
        changes["model.image_size"] = s.image_size
    cfg = inputs.recipe(RECIPE).with_overrides(changes, VTAB)
    user = dict(parse_override(o) for o in s.overrides)
    threads, _ = choice.thread_policy(cfg, checkpoint, set(user), inputs)  # the source run's, as vitlab finetune
    return cfg.with_overrides(threads, VTAB).with_overrides(user, COMMAND_LINE)


def threads_line(checkpoint: str, s: Settings, inputs: Inputs) -> str:
    """The plan line that says which threads and data workers the tasks train with, and why."""
    user = dict(parse_override(o) for o in s.overrides)
    return choice.thread_policy(inputs.recipe(RECIPE), checkpoint, set(user), inputs)[1]


def identity(checkpoint: str, task: Task, root: Path, s: Settings, inputs: Inputs) -> dict[str, Any]:
    """The identity of a task's work (files.identity): the checkpoint's content and the task's
    resolved run config with its learning-rate grid; not the checkpoint's path, nor the
    settings that change no number (the device, workers, checkpoint spacing: RESUMABLE_CHANGES)."""
    d = task_config(checkpoint, task, root, s, inputs).to_dict()
    d["model"].pop("checkpoint", None)
    for key in RESUMABLE_CHANGES:
        section, _, name = key.partition(".")
        d[section].pop(name, None)
    return work_identity(checkpoints.resolve(checkpoint), {"run": d, "lr_grid": list(s.grid or ())})


RESULT_SHAPE = {"task": str, "top1": Number(0, 1), "test_images": Number(1, integer=True), "lr?": Number(0),
                "identity?": object}


def finished(task: Task, out: Path, now: dict[str, Any]) -> Optional[dict[str, Any]]:
    """OUT/TASK/result.json when the task has one made by the work `now` names (identity);
    None when it has none; a ConfigError naming what differs when it is other work, or when
    the file is damaged."""
    done = out / task.name / "result.json"
    if not (done.exists() or done.is_symlink()):
        return None
    again = f"delete {done.parent} to run {task.name} again"
    result = read_json(done, RESULT_SHAPE, "VTAB task result", again, ConfigError)
    changed = differences(result.get("identity"), now)
    if changed:
        raise ConfigError(f"{done} is the result of other work ({'; '.join(changed[:4])}); it is kept: give another "
                          f"--out for this checkpoint and these settings, the same ones to use it, or {again}")
    return result


def run_task(checkpoint: str, task: Task, root: Path, out: Path, s: Settings, train: TrainFn, inputs: Inputs,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fine-tune and test one task (or read its result.json when it holds this work), reading
    the suite's `inputs` (the checkpoint and the source run's config, read once for every task)."""
    folder = out / task.name
    done = folder / "result.json"
    now = identity(checkpoint, task, root, s, inputs)
    result = finished(task, out, now)
    if result is not None:
        return result
    cfg = task_config(checkpoint, task, root, s, inputs)
    data = describe(task, root, s.accepted(task))  # (refuses a tfds copy other than VTAB's before training)
    if s.grid:
        arms = choice.arms("", s.grid)  # the rate alone, chosen on the val set
        swept = choice.choose(cfg, folder, arms, cfg.train.steps, set(), lambda c, o, _notes=(): train(c, o, inputs), log)
        summary, lr = swept["final"], swept["best_lr"]
    else:
        summary, lr = train(cfg, folder / "run", inputs), s.rate
    test = summary["splits"]["test"]
    image_size = list(cfg.model.changes["image_size"]) if "image_size" in cfg.model.changes else None  # as result.json reads back
    size = "the checkpoint's resolution" if image_size is None else "x".join(map(str, image_size)) + " px"
    grid = {k: summary[k] for k in ("grid", "ignored_pixels") if k in summary}  # (the final run's: loop.py)
    if any(grid.get("ignored_pixels", ())):
        size += f", the last {grid['ignored_pixels'][0]} pixel rows and {grid['ignored_pixels'][1]} columns ignored"
    result = {"task": task.name, "title": task.title, "group": task.group, "top1": test["top1"],
              "test_images": test["count"], "lr": lr, "steps": s.steps, "image_size": image_size, **grid,
              "data": data, "folder": str(folder), "identity": now}
    if distributed.is_main_process():
        atomic_write_text(done, json.dumps(result, indent=2))
    log(f"vtab {task.name}: test top-1 {test['top1']:.2%} on {test['count']:,} images (lr {lr:g}, {size})")
    return result


def collect(checkpoint: str, root: Path, out: Path, s: Settings, inputs: Inputs,
            tasks: Sequence[Task] = tuple(TASKS.values())) -> dict[str, dict[str, Any]]:
    """Every finished task's result under OUT (whichever job ran it), each checked to be this
    checkpoint's with these settings (`finished`: one of other work is refused by name)."""
    results: dict[str, dict[str, Any]] = {}
    for task in tasks:  # (the checkpoint is hashed only when a task has a result)
        if (out / task.name / "result.json").exists() and (result := finished(task, out, identity(checkpoint, task, root, s, inputs))):
            results[task.name] = result
    return results


def table_row(results: dict[str, dict[str, Any]], name: str, missing: dict[str, str]) -> dict[str, Any]:
    """Table 9's row: per-task top-1, the mean of each group, and the mean over tasks, each
    saying over how many tasks it is taken (`complete` only with all of TASKS)."""
    tasks = {t: (results[t]["top1"] if t in results else None) for t in TASKS}

    def aggregate(group: Optional[str], of: int) -> dict[str, Any]:  # the mean of the group's tasks with a result
        have = [v for t, v in tasks.items() if group in (None, TASKS[t].group) and v is not None]
        return {"mean": mean(have) if have else None, "tasks": len(have), "of": of}

    overall = aggregate(None, len(TASKS))
    return {"name": name, "tasks": tasks, "groups": {g: aggregate(g, n) for g, n in group_sizes().items()},
            "mean": overall, "complete": overall["tasks"] == len(TASKS), "missing": missing,
            "not_run": [t for t in TASKS if tasks[t] is None and t not in missing]}


def _pct(v: Optional[float]) -> str:
    return "absent" if v is None else f"{100 * v:.1f}"


def _agg(a: dict[str, Any]) -> str:
    return _pct(a["mean"]) + ("" if a["tasks"] == a["of"] else f" ({a['tasks']}/{a['of']})")


def markdown(row: dict[str, Any]) -> str:
    head = ["model", *(TASKS[t].title for t in TASKS), *GROUPS, "Mean"]
    cells = [row["name"], *(_pct(v) for v in row["tasks"].values()), *(_agg(row["groups"][g]) for g in GROUPS),
             _agg(row["mean"])]
    lines = [markdown_table(head, [cells]).rstrip("\n")]
    if not row["complete"]:
        lines += ["", f"Incomplete: {row['mean']['tasks']} of {row['mean']['of']} tasks; each mean is over the tasks "
                  "it names in brackets."]
        lines += [f"- {line}" for line in row["missing"].values()]
        lines += [f"- {t}: data present, not run yet" for t in row["not_run"]]
    return "\n".join(lines) + "\n"


def csv_text(row: dict[str, Any]) -> str:
    number = lambda v: "" if v is None else f"{v:.6f}"  # noqa: E731
    return csv_table(["model", *TASKS, *GROUPS, "mean", "tasks_in_mean", "complete"],
                     [[row["name"], *(number(v) for v in row["tasks"].values()),
                       *(number(row["groups"][g]["mean"]) for g in GROUPS), number(row["mean"]["mean"]),
                       row["mean"]["tasks"], row["complete"]]])


TABLES = ("vtab.md", "vtab.json", "vtab.csv")


def write_tables(row: dict[str, Any], out: Path, force: bool = False) -> dict[str, Path]:
    """OUT/vtab.md, vtab.json, vtab.csv: the row in three forms. Claimed, written and listed
    under the folder's lock, so that task jobs finishing together each find the others'."""
    paths = {"markdown": out / "vtab.md", "json": out / "vtab.json", "csv": out / "vtab.csv"}
    if distributed.is_main_process():
        owner = OutputFolder(out, "vtab", force=force)
        with owner.locked():
            owner.claim(TABLES)
            atomic_write_text(paths["markdown"], markdown(row))
            atomic_write_text(paths["json"], json.dumps(row, indent=2))
            atomic_write_text(paths["csv"], csv_text(row))
            owner.record(TABLES)
    return paths


def absent(root: Path, tasks: Sequence[Task] = tuple(TASKS.values())) -> dict[str, str]:
    """The tasks among `tasks` with no data under root, each with where to put it."""
    return {t.name: where_to_put(t, root) for t in tasks if locate(t, root) is None}


def check_suite(checkpoint: str, root: Path, out: Path, tasks: Sequence[Task], s: Settings, inputs: Inputs,
                force: bool = False) -> None:
    """What a run of the suite would refuse, refused before its first task: a user's tables in
    OUT, and a task's result of other work."""
    OutputFolder(out, "vtab", force=force).claim(TABLES)  # a user's (or an edited) vtab.md is refused unless `force`
    collect(checkpoint, root, out, s, inputs, tasks)


def run_suite(checkpoint: str, root: Path, out: Path, tasks: Sequence[Task], s: Settings, train: TrainFn,
              inputs: Inputs, name: str = "", log: Callable[[str], None] = print,
              force: bool = False) -> tuple[dict[str, Any], dict[str, Path]]:
    """Fine-tune every task of `tasks` that has data and is not done, then write the row of
    all results under OUT (Markdown, JSON, CSV): (row, the tables' paths). The tasks and their
    grid arms share one plan's `inputs`: the recipe, the checkpoint and the source run's
    config are read once for all of them."""
    check_suite(checkpoint, root, out, tasks, s, inputs, force)
    log(f"vtab plan: {threads_line(checkpoint, s, inputs)}")
    if tasks:  # the resolution and what the patch grid reads of it (a /14 model at 384: 27x27, 6 px ignored)
        model = architecture(task_config(checkpoint, tasks[0], root, s, inputs).model, inputs)
        h, w = model.image_size
        log(f"vtab plan: {model.name} at {h}x{w} px" + (f"; {grid_note(model)}" if grid_note(model) else ""))
    missing = absent(root)
    for task in tasks:
        if task.name in missing:
            log(f"vtab {missing[task.name]}")
            continue
        run_task(checkpoint, task, root, out, s, train, inputs, log)
    return report(checkpoint, root, out, s, inputs, force, name, missing)


def report(checkpoint: str, root: Path, out: Path, s: Settings, inputs: Inputs, force: bool = False, name: str = "",
           missing: Optional[dict[str, str]] = None) -> tuple[dict[str, Any], dict[str, Path]]:
    """The row of every result under OUT that is this work (`collect`), written to OUT's tables:
    (row, the tables' paths)."""
    missing = absent(root) if missing is None else missing
    run = holding_run(checkpoint)  # the row names a run's folder for RUN/checkpoints/*.safetensors, else the file's stem
    row = table_row(collect(checkpoint, root, out, s, inputs), name or (run.path.name if run else Path(checkpoint).stem), missing)
    return row, write_tables(row, out, force)
