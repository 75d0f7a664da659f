"""VTAB-1k fine-tuning and its Table 9 row (the paper's Table 2 VTAB column, Fig. 2, Table 9).

The paper's VTAB setting (Appendix B.1.1, Table 4): one setting for all 19 tasks, 2,500 steps
at learning rate 0.01, with the fine-tuning recipe's SGD (momentum 0.9, cosine decay, no
weight decay, clipping at 1, batch 512, warm-up 500 steps), trained on each task's 1,000
examples and evaluated on its full test split. The paper chose that setting by a small sweep
on the 200-example val sets; `Settings.grid` runs such a sweep per task (train on the 800,
score on the 200, then rerun the best rate on all 1,000). VTAB-1k's fine-tuning uses no
augmentation: the images are resized whole (no random crop, no flip; a flip changes the
label of dSprites orientation, a crop that of dSprites location).

Each task writes OUT/TASK/ (its run folder, or sweep/ and final/) and, when done,
OUT/TASK/result.json; a task with a result is not run again and an interrupted one resumes
from its checkpoint. The table is made from every result.json under OUT, so tasks run as
separate jobs (sweep/vtab.py) add up to one row. A task whose data is absent is listed with
where to put it and counted as absent, never left out of the mean silently: the mean then
says over how many of the 19 tasks it is taken.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from vitlab.config import ConfigError, RunConfig, load_recipe, parse_override
from vitlab.config.provenance import COMMAND_LINE
from vitlab.data.vtab import GROUPS, TASKS, Task, group_sizes, mean
from vitlab.data.vtab_sources import locate, where_to_put
from vitlab.files import OutputFolder, atomic_write_text
from vitlab.tables import csv_table, markdown_table
from vitlab.train import distributed
from vitlab.train import finetune_choice as choice
from vitlab.train.finetune import TABLE4_STEPS

VTAB_LR = 0.01  # Table 4
VTAB_WARMUP = 500  # the fine-tuning recipe's warm-up (at most a fifth of a shorter run)
TrainFn = Callable[[RunConfig, Path], dict[str, Any]]


# The keys vitlab vtab sets from its own flags: an override of one would silently beat the flag.
FLAGS = {"train.steps": "--steps", "optim.lr": "--lr (or --lr-grid)", "train.batch_size": "--batch-size",
         "model.image_size": "--image-size", "train.seed": "--seed", "train.device": "--device"}


@dataclass(frozen=True)
class Settings:
    steps: int = TABLE4_STEPS["vtab"]
    lr: Optional[float] = None  # None: VTAB_LR, or the grid's choice
    batch_size: int = 512
    grid: Optional[Sequence[float]] = None  # learning rates to choose from on the 200-example val set; None = lr
    image_size: Optional[int] = None  # None: the checkpoint's own (the paper fine-tunes at 384)
    seed: int = 0
    device: str = "auto"
    overrides: tuple[str, ...] = ()  # SECTION.KEY=VALUE, applied last

    def __post_init__(self) -> None:
        if self.grid is not None and (not self.grid or min(self.grid) <= 0):
            raise ConfigError(f"--lr-grid {','.join(f'{r:g}' for r in self.grid)!r}: give positive rates separated by commas")
        if self.grid is not None and self.lr is not None:
            raise ConfigError("--lr and --lr-grid both set the learning rate (--lr-grid chooses it per task): give one")
        keys = [parse_override(o)[0] for o in self.overrides]
        flagged = [f"{o} (vitlab vtab sets it with {FLAGS[k]})" for o, k in zip(self.overrides, keys) if k in FLAGS]
        if flagged:  # the override would win over the flag without a word
            raise ConfigError(f"{'; '.join(flagged)}: give it with the flag")
        object.__setattr__(self, "grid", tuple(self.grid or ()))
        object.__setattr__(self, "lr", VTAB_LR if self.lr is None else self.lr)


def checkpoint_name(checkpoint: str) -> str:
    """How the row names the model: a run's folder for RUN/checkpoints/*.safetensors, else the file's stem."""
    path = Path(checkpoint)
    return path.parent.parent.name if path.parent.name == "checkpoints" else path.stem


def task_config(checkpoint: str, task: Task, root: Path, s: Settings) -> RunConfig:
    """The fine-tuning run of one task: the finetune recipe with the VTAB setting."""
    changes: dict[str, Any] = {
        "model.checkpoint": checkpoint, "data.name": f"vtab:{task.name}:{root}", "data.eval_data": "",
        "data.train_split": "train", "data.eval_splits": ["test"], "data.crop_scale": [1.0, 1.0],
        "data.crop_ratio": [1.0, 1.0], "data.hflip": False, "train.steps": s.steps, "train.epochs": 0.0,
        "train.batch_size": s.batch_size, "train.seed": s.seed, "train.device": s.device, "optim.lr": s.lr,
        "optim.warmup_steps": min(VTAB_WARMUP, max(1, s.steps // 5)), "train.ckpt_every": max(1, min(500, s.steps)),
    }
    if s.image_size:
        changes["model.image_size"] = s.image_size
    cfg = load_recipe("finetune").with_overrides(changes, "vtab")
    return cfg.with_overrides(dict(parse_override(o) for o in s.overrides), COMMAND_LINE)


def run_task(checkpoint: str, task: Task, root: Path, out: Path, s: Settings, train: TrainFn,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fine-tune and test one task (or read its result.json when it has one)."""
    folder = out / task.name
    done = folder / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    cfg = task_config(checkpoint, task, root, s)
    if s.grid:
        arms = [choice.Arm(choice.PLANNED, lr) for lr in s.grid]  # the rate alone, chosen on the val set
        swept = choice.choose(cfg, folder, arms, cfg.train.steps, set(), lambda c, o, _notes=(): train(c, o), log)
        summary, lr = swept["final"], swept["best_lr"]
    else:
        summary, lr = train(cfg, folder / "run"), s.lr
    test = summary["splits"]["test"]
    result = {"task": task.name, "title": task.title, "group": task.group, "top1": test["top1"],
              "test_images": test["count"], "lr": lr, "steps": s.steps, "folder": str(folder)}
    if distributed.is_main_process():
        atomic_write_text(done, json.dumps(result, indent=2))
    log(f"vtab {task.name}: test top-1 {test['top1']:.2%} on {test['count']:,} images (lr {lr:g})")
    return result


def collect(out: Path) -> dict[str, dict[str, Any]]:
    """Every finished task's result under OUT (whichever job ran it)."""
    return {name: json.loads((out / name / "result.json").read_text())
            for name in TASKS if (out / name / "result.json").is_file()}


def table_row(results: dict[str, dict[str, Any]], name: str, missing: dict[str, str]) -> dict[str, Any]:
    """Table 9's row: per-task top-1, the mean of each group, and the mean over tasks, each
    saying over how many tasks it is taken (`complete` only with all 19)."""
    tasks = {t: (results[t]["top1"] if t in results else None) for t in TASKS}
    groups = {}
    for g, n in group_sizes().items():
        have = [v for t, v in tasks.items() if TASKS[t].group == g and v is not None]
        groups[g] = {"mean": mean(have) if have else None, "tasks": len(have), "of": n}
    have = [v for v in tasks.values() if v is not None]
    return {"name": name, "tasks": tasks, "groups": groups,
            "mean": {"mean": mean(have) if have else None, "tasks": len(have), "of": len(TASKS)},
            "complete": len(have) == len(TASKS), "missing": missing,
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


def tables_owner(out: Path) -> OutputFolder:
    """The suite folder's tables, claimed: a user's vtab.md there is refused (files.OutputFolder),
    unless the folder already holds this suite's tasks (a task folder with its result)."""
    owner = OutputFolder(out, "vtab", force=any((out / name / "result.json").is_file() for name in TASKS),
                         offer_force=False)
    owner.claim(TABLES)
    return owner


def write_tables(row: dict[str, Any], out: Path) -> dict[str, Path]:
    """OUT/vtab.md, vtab.json, vtab.csv: the row in three forms."""
    paths = {"markdown": out / "vtab.md", "json": out / "vtab.json", "csv": out / "vtab.csv"}
    if distributed.is_main_process():
        owner = tables_owner(out)
        atomic_write_text(paths["markdown"], markdown(row))
        atomic_write_text(paths["json"], json.dumps(row, indent=2))
        atomic_write_text(paths["csv"], csv_text(row))
        owner.record(TABLES)
    return paths


def absent(root: Path, tasks: Sequence[Task] = tuple(TASKS.values())) -> dict[str, str]:
    """The tasks among `tasks` with no data under root, each with where to put it."""
    return {t.name: where_to_put(t, root) for t in tasks if locate(t, root) is None}


def run_suite(checkpoint: str, root: Path, out: Path, tasks: Sequence[Task], s: Settings, train: TrainFn,
              name: str = "", log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fine-tune every task of `tasks` that has data and is not done, then write the row of
    all results under OUT (Markdown, JSON, CSV) and return it."""
    tables_owner(out)  # a user's tables there: refused before the first task, not after the last
    missing = absent(root)
    for task in tasks:
        if task.name in missing:
            log(f"vtab {missing[task.name]}")
            continue
        run_task(checkpoint, task, root, out, s, train, log)
    row = table_row(collect(out), name or checkpoint_name(checkpoint), missing)
    write_tables(row, out)
    return row
