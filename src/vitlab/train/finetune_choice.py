"""Which fine-tuning recipe and rate, chosen on the dev split: the paper's SGD or AdamW.

The paper fine-tunes with SGD (momentum 0.9, no weight decay, the inception crop) and picks
the learning rate from Table 4's grid on a dev split (Appendix B.1.1). That recipe is made
for large, long-trained sources whose features already separate the target's classes. A
small source and a few hundred steps do better with the recipe vitlab trains from scratch
with (AdamW, weight decay, a gentler crop): docs/transfer.md measured the
paper's recipe 20-35 points below it on two of three targets from the same checkpoint.

So `vitlab finetune` does not assume either. Its quick sweep trains every (recipe, rate) arm
for a short run on the training set minus the dev split, scores each on the dev split, and
trains the best arm on the whole training set:

    paper   SGD momentum 0.9, no weight decay, inception crop from 5%, warm-up 5%,
            Table 4's grid (0.001, 0.003, 0.01, 0.03)
    adamw   AdamW, weight decay 0.05, no label smoothing, the whole image unflipped (no
            crop, no flip, no smoothing: see ADAMW), warm-up 25% (the CPU recipes' 100 of 390 steps),
            rates 0.0003 and 0.001 (below the CPU recipe's from-scratch 0.002, never above
            it), the new head started as a linear probe of the frozen features
            (train/probe_head.py: LP-FT)

The paper's own learning-rate sweep (`--recipe paper`, `--lr-sweep`, `vitlab vtab --lr-grid`)
is the same mechanism with one recipe, the plan's (`PLANNED`): its arms are the rates of
Table 4's grid, in OUT/sweep/lr-RATE. `choose` is the one loop for every such sweep: each arm
on the training set minus the dev split, scored on the dev split, the best against the
runner-up with its noise (two standard errors), the best on the whole training set.

Every sweep step is compute: the final run's summary.json counts the sweep's images, FLOPs
and seconds beside its own (`compute_with_sweep`). Settings the user gave (an optimiser, a
crop, label smoothing, a warm-up) hold in every arm.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from vitlab.config import ConfigError, RunConfig
from vitlab.config.provenance import PLAN, SWEEP, Origin
from vitlab.files import atomic_write_text
from vitlab.run_layout import holding_run
from vitlab.train import distributed
from vitlab.train.inputs import Inputs
from vitlab.train.report import TrainingDiverged
from vitlab.train.run_folder import read_summary

CHOICES = ("auto", "paper", "adamw")  # --recipe: auto = choose on the dev split
WARMUP_SHARE = 0.05  # the paper's 500 warm-up steps of 10,000 (Appendix B.1.1)


@dataclass(frozen=True)
class Recipe:
    """A fine-tuning recipe: what it changes in the paper's config, its warm-up share (None:
    the plan's own warm-up, at most WARMUP_SHARE of a short arm), its rates (None: Table 4's
    grid for the dataset, or --lr-grid)."""

    name: str
    words: str
    changes: Mapping[str, Any] = field(default_factory=dict)
    warmup_share: Optional[float] = WARMUP_SHARE
    grid: Optional[tuple[float, ...]] = None


# The plan's config as it is: the paper's protocol (--recipe paper), or a recipe file followed
# as written; its sweep chooses the rate only (OUT/sweep/lr-RATE).
PLANNED = Recipe("", "the plan's own recipe", warmup_share=None)
PAPER = Recipe("paper", "the paper's SGD (momentum 0.9, no weight decay, inception crop from 5%)")
ADAMW = Recipe(
    "adamw", "AdamW as vitlab trains from scratch (weight decay 0.05) on the whole image unflipped, without "
    "label smoothing, from a head fitted as a linear probe of the frozen features",
    changes={"optim.name": "adamw", "optim.weight_decay": 0.05, "data.crop": "whole", "data.hflip": False,
             "train.label_smoothing": 0.0, "model.head_start": "probe"},
    warmup_share=0.25, grid=(0.0003, 0.001),
)
# Why AdamW's rates stop below the from-scratch rate: a sweep of short arms favours large rates
# (a large rate gains most in the first steps and pays later), and a pretrained start needs
# smaller steps than a random one. With 0.001 and 0.003, the 15-step arms chose 0.003 on four of
# five Fashion-MNIST seeds, and those four fine-tunes of 300 steps scored 47.7-54.2% where the
# seed that chose 0.001 scored 64.7% (the 5-seed run of docs/transfer.md before this change).
# Why the whole image, unflipped: the probe head is fitted on whole, unflipped images (the
# evaluation transform), and a short fine-tune on random crops and mirror images spends its
# steps moving the features and the head to those inputs, undoing the start before the
# augmentation's regularisation can pay (it needs many epochs; a fine-tune has a fraction of
# one). With the crop from 35% and flips, every fine-tune from a probe head ended below it: on
# the digits (40 steps) 85.0% -> 71.1% at 0.0003 and 57.2% at 0.001 (no flip: 74.4%, 68.1%;
# no crop: 80.0%, 78.3%; neither: 85.3%, 88.3%); on Fashion-MNIST from the 2% checkpoints of
# paper/data-size (100 steps at 0.002), BiT 74.6% -> 71.7% with both (no label smoothing),
# 76.8% with the flip alone, 79.2% with neither, and a ViT 58.9% -> 67.2% with neither (no label
# smoothing), where with both it fell to 49.8% at 0.0003 and 49.1% at 0.0001: a lower rate does
# not help, nor does the paper's SGD with its inception crop (47.9% at 0.01, 46.2% at 0.003).
# A recipe that trains for many epochs sets data.crop again.
# Why no label smoothing: the probe head is a logistic regression on plain labels, and smoothed
# ones (0.1, the from-scratch recipe's) move its optimum, so the first steps pull the head and
# the features away from the start rather than improve on it. In paper/data-size's run of
# seeds 12-16 with 0.1, BiT-14w8 gained 0.4 points over its probe start on average, and seed 16
# ended 0.7 below it on the test set. On the dev split (100 steps on train-minus-dev, the two
# BiT checkpoints of seeds 16 and 15 retrained bit for bit), the gain over the dev start with
# smoothing 0.1 was +1.2 and -0.1 points at 0.0003, -1.5 (seed 16) at 0.0001 (a lower rate does
# not help) and +4.1 (seed 16) at 0.001; without it +3.7 and +3.5 at 0.0003, +2.3 and +1.4 at
# 0.0001, and +5.7 (seed 16) at 0.001. A fine-tune whose head did not start from a probe may
# set train.label_smoothing again.
RECIPES = {r.name: r for r in (PLANNED, PAPER, ADAMW)}


@dataclass(frozen=True)
class Arm:
    """One run of the sweep: a recipe at one learning rate."""

    recipe: Recipe
    lr: float

    @property
    def name(self) -> str:
        """Its folder under OUT/sweep/ and its name in sweep.json."""
        return f"{self.recipe.name}-lr-{self.lr:g}" if self.recipe.name else f"lr-{self.lr:g}"

    @property
    def label(self) -> str:
        return f"{self.recipe.name} lr {self.lr:g}" if self.recipe.name else f"lr {self.lr:g}"


def arms(choice: str, table4_grid: Sequence[float], rates: Optional[Sequence[float]] = None) -> list[Arm]:
    """The arms a sweep tries, every sweep's (finetune's, vtab's grid): each recipe the choice
    allows ("auto": both; "": the plan's own, the rate alone) at each of its rates (`rates`,
    from --lr-grid, replace the rates of a single recipe)."""
    chosen = [PAPER, ADAMW] if choice == "auto" else [RECIPES[choice]]
    out = []
    for recipe in chosen:
        grid = tuple(rates) if rates and len(chosen) == 1 else recipe.grid or tuple(table4_grid)
        out += [Arm(recipe, lr) for lr in grid]
    return out


def apply(cfg: RunConfig, recipe: Recipe, explicit: set[str], steps: Optional[int] = None,
          origin: Origin = SWEEP) -> RunConfig:
    """The config with a recipe's changes and warm-up share (of the run's steps), leaving the
    keys the user set; PLANNED keeps the plan's warm-up, at most WARMUP_SHARE of a short arm
    (`steps`), which a longer one would outlast. A short arm of a recipe with a share warms up
    as the run it stands for does, for at most its own length: its steps are that run's first
    ones (a share of the arm alone warmed a 10-step AdamW arm up in 2 steps, and its second step
    at 0.001 sent a probe head's loss from 1.3 to 9.9 in paper/data-size's first run). `origin`:
    the layer that chose the recipe (the sweep, or the plan when --recipe named it)."""
    total = steps or cfg.train.steps
    changes = {k: v for k, v in recipe.changes.items() if k not in explicit}
    if recipe.warmup_share is None:
        if steps and steps < cfg.train.steps:
            changes["optim.warmup_steps"] = warmup(cfg.optim.warmup_steps, steps)
    elif "optim.warmup_steps" not in explicit and total:
        run = warmup(cfg.optim.warmup_steps, max(total, cfg.train.steps), recipe.warmup_share)
        changes["optim.warmup_steps"] = min(run, total)
    return cfg.with_overrides(changes, origin) if changes else cfg


def warmup(current: int, total: int, share: Optional[float] = None) -> int:
    """The one rule of a fine-tune's warm-up: `share` of the run's `total` steps (at least 1);
    without a share the current warm-up, cut to WARMUP_SHARE of the run where it would outlast
    it (the paper's 500 of 10,000 steps)."""
    if share is not None:
        return max(1, round(share * total))
    return min(current, max(1, round(WARMUP_SHARE * total)))


QUICK_SHARE = 0.05  # each arm of a quick sweep trains for this share of the run's steps
MIN_ARM_STEPS = 10


def arm_steps(total: int) -> int:
    """A quick sweep's length per arm: QUICK_SHARE of the run, at least MIN_ARM_STEPS steps."""
    return max(MIN_ARM_STEPS, round(QUICK_SHARE * total))


def resolved(choose: str, explicit: set[str], cfg: RunConfig) -> tuple[str, list[str]]:
    """`--recipe` as it applies: (the recipe the plan follows, "paper", "adamw" or "auto": chosen
    by the sweep; its plan lines). Auto chooses on the dev split, unless the user set the rate
    or the optimiser (a rate means one optimiser's scale: the paper's SGD, or AdamW when
    optim.name says so)."""
    if choose != "auto" or not {"optim.lr", "optim.name"} & explicit:
        return choose, []
    name = "adamw" if "optim.name" in explicit and cfg.optim.name in ("adamw", "adam") else "paper"
    given = "--lr" if "optim.lr" in explicit else "optim.name"
    return name, [f"recipe: {RECIPES[name].words}, as {given} was given: no sweep chooses between the recipes "
                  "(--recipe to pick one)"]


@dataclass
class Plan:
    """A fine-tuning run decided (finetune.plan): its config, folder and plan lines, what its
    runs read, read once (`inputs`: the recipe, the checkpoint, the data splits, the probe
    heads), the sweep before it (`arms`: none, the config runs as it is; `sweep_steps` each
    arm's length, None for the whole run) and the keys the user set (`explicit`)."""

    config: RunConfig
    out: Path
    notes: list[str]
    inputs: Inputs
    arms: list[Arm] = field(default_factory=list)
    sweep_steps: Optional[int] = None
    explicit: set[str] = field(default_factory=set)


def decide(base: Plan, chosen: tuple[str, list[str]], table4_grid: Sequence[float], rates: Optional[Sequence[float]],
           full_sweep: bool, dev_note: str) -> Plan:
    """`base` (its config in steps, without arms) with the AdamW recipe, or the choice between
    both (the paper's alone is finetune.fit_defaults'); `chosen` is `resolved`'s."""
    name, said = chosen
    cfg, explicit = base.config, base.explicit
    total = cfg.train.steps
    warm = f"warm-up {PAPER.warmup_share:.0%} of each run with the paper's recipe, {ADAMW.warmup_share:.0%} with " \
        "AdamW (the CPU recipes' 100 of 390 steps)"
    if name == "adamw" and "optim.lr" in explicit:
        return replace(base, config=apply(cfg, ADAMW, explicit, origin=PLAN),
                       notes=[*base.notes, *said, f"recipe: {ADAMW.words}", f"warm-up {ADAMW.warmup_share:.0%} of the run"])
    candidates = arms(name, table4_grid, rates)
    steps = None if full_sweep else arm_steps(total)
    length = "the whole run" if steps is None else f"{steps} steps"
    what = "between the paper's SGD and AdamW" if name == "auto" else f"for {ADAMW.words}"
    sweep = (f"recipe and learning rate: a sweep {what} first, {len(candidates)} runs of {length} "
             f"({', '.join(a.name for a in candidates)}) on the training set minus the dev split, "
             "scored on the dev split; the best trains on the whole training set, and the sweep's "
             f"{len(candidates)} x {steps or total} steps count as compute (--recipe paper for the paper's protocol; "
             "--lr to skip the sweep)")
    return replace(base, arms=candidates, sweep_steps=steps, notes=[*base.notes, *said, sweep, dev_note, warm])


def two_standard_errors(p1: float, p2: float, n: int) -> float:
    """Two standard errors of the difference of two accuracies measured on the same n images
    (as independent: a conservative margin for paired runs)."""
    p = (p1 + p2) / 2
    return 2 * math.sqrt(max(2 * p * (1 - p), 1e-12) / max(n, 1))


def verdict(scores: Mapping[str, float], arm_recipes: Mapping[str, str], dev_count: int) -> dict[str, Any]:
    """The winning arm, and by how much it beat the runner-up, with the noise (two standard
    errors of the difference on the dev images). The runner-up is the other recipe's best arm
    when the sweep compares recipes, else the second-best rate."""
    best = max(scores, key=lambda a: (scores[a], arm_recipes[a] in ("paper", "")))
    others = [a for a in scores if arm_recipes[a] != arm_recipes[best]] or [a for a in scores if a != best]
    out: dict[str, Any] = {"best": best, "recipe": arm_recipes[best], "dev_top1": scores[best], "dev_count": dev_count}
    if others:
        runner = max(others, key=lambda a: scores[a])
        margin = scores[best] - scores[runner]
        noise = two_standard_errors(scores[best], scores[runner], dev_count)
        out.update(runner_up=runner, margin=margin, noise=noise, within_noise=margin <= noise)
    return out


def verdict_line(v: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    """The plan line that says which arm won and by how much, with the noise."""
    best = labels[v["best"]]
    head = (f"recipe: {v['recipe']} ({best.split(' ', 1)[1]})" if v["recipe"] else best) + \
        f" scored {v['dev_top1']:.1%} on the {v['dev_count']:,} dev images"
    if "runner_up" not in v:
        return head
    runner = labels[v["runner_up"]]
    if v["recipe"] and not runner.startswith(v["recipe"] + " "):  # the other recipe's best
        other, rate = runner.split(" ", 1)
        gap = f"; {other}'s best ({rate}) {v['dev_top1'] - v['margin']:.1%}: {v['recipe']} by "
    else:
        gap = f"; the next best, {runner}, {v['dev_top1'] - v['margin']:.1%}: by "
    gap += f"{100 * v['margin']:.1f} points, noise (2 standard errors) {100 * v['noise']:.1f}"
    return head + gap + (": within the noise, so the choice is uncertain (--recipe picks one, --lr a rate)"
                         if v["within_noise"] else "")


def edge_note(grid: Sequence[float], best: float) -> str:
    """A warning when the best rate is the grid's smallest or largest: the optimum may lie beyond."""
    if len(grid) < 2 or best not in (min(grid), max(grid)):
        return ""
    side, beyond = ("smallest", min(grid) / 3) if best == min(grid) else ("largest", max(grid) * 3)
    return (f"it is the grid's {side} rate, so a better one may lie beyond it: try --lr-grid with {beyond:.2g} "
            "on that side")


def summed_compute(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The compute of several runs added up (images, FLOPs, seconds; the last one's device)."""
    keys = ("images_seen", "train_flops", "wall_s", "cpu_s", "gpu_s", "forward_images")
    parts = [s["compute"] for s in summaries if s.get("compute")]
    total: dict[str, Any] = {k: round(sum(p.get(k, 0) for p in parts), 3) for k in keys}
    if not total["forward_images"]:
        del total["forward_images"]
    if parts:
        total.update(forward_gflops=parts[-1]["forward_gflops"], device=parts[-1]["device"])
    return total


def sweep_config(cfg: RunConfig, arm: Arm, explicit: set[str], steps: int) -> RunConfig:
    """An arm's short run on train-minus-dev, scored on dev."""
    return apply(cfg, arm.recipe, explicit, steps).with_overrides(
        {"optim.lr": arm.lr, "train.steps": steps, "train.epochs": 0.0, "data.train_split": "train-minus-dev",
         "data.eval_splits": ["dev"], "data.eval_data": ""}, SWEEP)


def check_sweep_folder(out: Path) -> None:
    """Refuse, before any training, a folder that is not new, empty or a sweep's: its runs and
    sweep.json would go among the user's files."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder for the sweep")
    theirs = sorted(p.name for p in out.iterdir() if p.name not in SWEEP_FOLDER) if out.is_dir() else []
    if theirs:
        raise ConfigError(f"{out} exists and is not a vitlab run folder or sweep (it holds "
                          f"{', '.join(theirs[:3])}); refusing to write into it: choose a new --out folder")


SWEEP_FOLDER = ("sweep", "final", "sweep.json")  # what `choose` writes into its folder


def choose(cfg: RunConfig, out: Path, candidates: Sequence[Arm], steps: int, explicit: set[str],
           train_fn: Callable[..., dict[str, Any]], log: Callable[[str], None]) -> dict[str, Any]:
    """Run the sweep (OUT/sweep/ARM/, each resumable), train the best arm on the whole
    training set (OUT/final/), and write OUT/sweep.json; returns its content. `steps`: each
    arm's length. `train_fn(config, folder, more_notes=()) -> summary` runs one training.
    An arm whose loss diverges where divergence stops a run (a sweep cell: TrainingDiverged)
    is out of the choice, its reason in sweep.json: that rate is too high, which is what the
    sweep asks (a random-init control's probe head diverged at 0.001 in paper/data-size,
    where 0.0003 trained); only a sweep in which every arm diverges stops."""
    check_sweep_folder(out)
    scores, labels, recipes, summaries = {}, {}, {}, []
    diverged: dict[str, str] = {}
    dev_count = 0
    for arm in candidates:
        try:
            summary = train_fn(sweep_config(cfg, arm, explicit, steps), out / "sweep" / arm.name)
        except TrainingDiverged as e:
            if len(diverged) + 1 == len(candidates):
                raise
            diverged[arm.name] = str(e)
            log(f"sweep: {arm.label} -> diverged, out of the choice")
            continue
        summaries.append(summary)
        dev = summary["splits"]["dev"]
        scores[arm.name], labels[arm.name], recipes[arm.name], dev_count = dev["top1"], arm.label, arm.recipe.name, \
            dev["count"]
        log(f"sweep: {arm.label} -> dev top-1 {dev['top1']:.2%}")
    v = verdict(scores, recipes, dev_count)
    winner = next(a for a in candidates if a.name == v["best"])
    grid = [a.lr for a in candidates if a.recipe == winner.recipe and a.name not in diverged]
    edge = edge_note(grid, winner.lr) if winner.recipe.grid is None else ""
    line = verdict_line(v, labels) + (f"; {edge}" if edge else "")
    log(f"{line}; training it on the full training set")
    final_cfg = apply(cfg, winner.recipe, explicit).with_overrides({"optim.lr": winner.lr}, SWEEP)
    final = train_fn(final_cfg, out / "final", (line,))  # the verdict among the final run's plan lines
    result = {
        "arms": [{"arm": a.name, "recipe": a.recipe.name, "lr": a.lr, "steps": steps, "dev_top1": scores.get(a.name),
                  **({"diverged": diverged[a.name]} if a.name in diverged else {})} for a in candidates],
        **v, "grid": grid, "at_edge": bool(edge), "best_lr": winner.lr, "best_recipe": winner.recipe.name,
        "line": line, "sweep_steps": steps * len(candidates), "sweep_compute": summed_compute(summaries),
        "compute_with_sweep": summed_compute([*summaries, final]), "final": final,
    }
    if distributed.is_main_process():
        atomic_write_text(out / "sweep.json", json.dumps(result, indent=2))
        count_sweep_in(out / "final" / "summary.json", result)
    return result


def count_sweep_in(summary_file: Path, result: Mapping[str, Any]) -> None:
    """Add the sweep's compute to the final run's summary.json, beside the run's own (where the
    training function wrote one)."""
    if not summary_file.exists():
        return
    summary = read_summary(summary_file)  # the final run's, just written: a damaged one is named
    summary["sweep"] = {k: result[k] for k in ("best", "best_recipe", "best_lr", "sweep_steps", "sweep_compute")}
    summary["compute_with_sweep"] = result["compute_with_sweep"]
    summary["steps_with_sweep"] = summary.get("steps", 0) + result["sweep_steps"]
    atomic_write_text(summary_file, json.dumps(summary, indent=2))


def thread_policy(cfg: RunConfig, checkpoint: str, explicit: set[str], inputs: Inputs) -> tuple[dict[str, Any], str]:
    """Threads and data workers as `vitlab train` runs them: the source run's own (its
    config.yaml beside checkpoints/, read once in `inputs`), else the recipe's; with the plan
    line that says so."""
    source = inputs.source_config(checkpoint)
    threads, workers = (source.train.threads, source.data.num_workers) if source else (cfg.train.threads,
                                                                                     cfg.data.num_workers)
    changes = {k: v for k, v in (("train.threads", threads), ("data.num_workers", workers)) if k not in explicit}
    final = cfg.with_overrides(changes)
    t, w = final.train.threads, final.data.num_workers
    said = (f"{t} compute thread{'s' if t > 1 else ''}" if t else "one compute thread per core") + \
        f" and {w} data worker{'s' if w != 1 else ''}"
    run = holding_run(checkpoint)
    where = "as set" if {"train.threads", "data.num_workers"} <= explicit else (
        f"as the source run trained ({run.config})" if source and run
        else "the recipe's (the source is not a vitlab run)")
    return changes, f"threads: {said}, {where} (train.threads, --workers to change)"


