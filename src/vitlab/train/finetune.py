"""The paper's fine-tuning protocol (§3.2, Appendix B.1.1, Table 4).

Fine-tuning starts from a pretrained checkpoint at a higher resolution: the pretrained head
and pre-logits layer are dropped, a zero-initialised D x K head is added, and the position
embeddings are resized to the new patch grid. SGD with momentum 0.9, cosine decay, no weight
decay, gradient clipping at 1, batch 512, and the number of steps per dataset of Table 4.
The learning rate is chosen from Table 4's grid on a held-out dev split (2% of CIFAR, 10% of
Pets and Flowers, 1% of ImageNet), then the run is repeated on the whole training set.

The paper's numbers are for 224 px ImageNet models and large targets. `fit_defaults` keeps
their proportions on other checkpoints and data: the warm-up is at most 5% of the run (the
paper's 500 of 10,000 steps), the batch no larger than the training set, and, where the
training set is small, the learning rate comes from a quick form of the sweep (Table 4's
grid, each rate trained for a quarter of the steps) instead of a fixed default.

`plan` turns a checkpoint, a dataset and the user's settings into all of that (the config,
the run folder, the plan lines, the sweep); `run` carries it out. `vitlab finetune` is these
two calls:

    p = finetune.plan("runs/cifar10/checkpoints/last.safetensors", "digits", options={"steps": 200})
    result = finetune.run(p)   # the final run's summary, or the sweep's result with "best_lr"
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from vitlab.checkpoints import is_pretrained_name, read_checkpoint
from vitlab.config import ConfigError, RunConfig, load_recipe
from vitlab.data import DEV_FRACTIONS, identity, open_dataset, paper_dataset
from vitlab.data.transforms import model_transform
from vitlab.files import atomic_write_text
from vitlab.train import distributed, finetune_choice as choice, recipe as recipes
from vitlab.train.build import architecture
from vitlab.train.compute import format_compute
from vitlab.log import get_logger

LOG = get_logger("train")

# Table 4: fine-tuning steps and the learning-rate grid per dataset.
TABLE4_STEPS = {"imagenet": 20_000, "cifar10": 10_000, "cifar100": 10_000, "pets": 500, "flowers": 500, "vtab": 2_500}
TABLE4_LRS = {
    "imagenet": (0.003, 0.01, 0.03, 0.06),
    "cifar10": (0.001, 0.003, 0.01, 0.03),
    "cifar100": (0.001, 0.003, 0.01, 0.03),
    "pets": (0.001, 0.003, 0.01, 0.03),
    "flowers": (0.001, 0.003, 0.01, 0.03),
    "vtab": (0.01,),
}


DEFAULT_GRID = (0.001, 0.003, 0.01, 0.03)  # Table 4's grid for every dataset but ImageNet and VTAB
DEFAULT_STEPS = 500  # Table 4's count for its small datasets (Pets, Flowers), for data it does not list
WARMUP_SHARE = 0.05  # the paper's 500 warm-up steps of 10,000 (Appendix B.1.1)
SMALL_DATA = 20_000  # training sets up to this size get the quick learning-rate sweep by default
QUICK_SHARE = 0.1  # each quick-sweep run trains for this share of the run's steps (40% more compute in all)
MIN_STEPS_PER_EPOCH = 4  # the batch leaves at least this many steps per epoch (Table 4's Flowers: 2,040 / 512)
RESOLUTION_STEP = 384 / 224  # the paper's step up: pre-trained at 224, fine-tuned at 384 (§3.2)
RECIPE = "finetune"  # the shipped recipe fine-tuning starts from

# Options whose value, when given, the fitted defaults leave alone.
EXPLICIT_OPTIONS = {"batch_size": "train.batch_size", "warmup_steps": "optim.warmup_steps", "lr": "optim.lr",
                    "image_size": "model.image_size", "workers": "data.num_workers",
                    "label_smoothing": "train.label_smoothing"}


def say(line: str) -> None:
    """The plan and sweep lines, on stdout as they happen (a log file sees them in order),
    through the "vitlab.train" logger (vitlab/log.py)."""
    LOG.info(line)


@dataclass
class Defaults:
    """What fit_defaults decided: the config, the plan-line notes, and whether (and how long)
    a quick learning-rate sweep runs first."""

    config: RunConfig
    notes: list[str] = field(default_factory=list)
    quick_sweep_steps: Optional[int] = None


def fit_defaults(cfg: RunConfig, n_train: int, explicit: set[str], lr_sweep_asked: bool = False,
                 table4_steps: Optional[int] = None) -> Defaults:
    """The recipe's numbers fitted to this checkpoint and data; `explicit` holds the keys the
    user set (`train.batch_size`, `optim.warmup_steps`, `optim.lr`, `model.image_size`), which
    are left as they are. The global batch is the recipe's: where it is more than a quarter of
    the training set, it runs as micro-batches (gradient accumulation, the same update), and
    only a training set smaller than one batch makes it smaller. A run of Table 4's length
    on its dataset (`table4_steps`) keeps the recipe's warm-up, as vision_transformer does
    (configs/common.py: 500 steps, also of 500-step runs)."""
    t, o = cfg.train, cfg.optim
    changes: dict[str, Any] = {}
    notes = []
    fill = max(1, n_train // MIN_STEPS_PER_EPOCH)
    if "train.batch_size" not in explicit and t.batch_size > n_train:
        changes["train.batch_size"] = batch = 2 ** max(0, fill.bit_length() - 1)
        notes.append(f"batch {batch}: the recipe's {t.batch_size} is more than the {n_train:,} training images")
    elif "train.batch_size" not in explicit and not t.micro_batch_size and t.batch_size > fill:
        changes["train.micro_batch_size"] = micro = max(d for d in range(1, fill + 1) if t.batch_size % d == 0)
        notes.append(f"batch {t.batch_size}, the recipe's, as {t.batch_size // micro} micro-batches of {micro}: "
                     f"the batch is more than a quarter of the {n_train:,} training images")
    batch = changes.get("train.batch_size", t.batch_size)
    total = t.steps or max(1, math.ceil(t.epochs * (n_train // batch)))
    cap = o.warmup_steps if total == table4_steps else max(1, round(WARMUP_SHARE * total))
    if "optim.warmup_steps" not in explicit and o.warmup_steps > cap:
        changes["optim.warmup_steps"] = cap
        notes.append(f"warm-up {cap} steps: 5% of the {total} (the paper's 500 of 10,000); the recipe's "
                     f"{o.warmup_steps} would outlast the run")
    quick = None
    if not lr_sweep_asked and "optim.lr" not in explicit:
        if n_train <= SMALL_DATA:
            quick = max(20, round(QUICK_SHARE * total))
            notes.append(f"learning rate: a quick sweep first, Table 4's grid, {quick} steps per rate on the "
                         "training set minus a dev split, scored on the dev split (--lr to skip it; --lr-sweep for the full one)")
        else:
            notes.append(f"learning rate {o.lr:g}: the recipe's, not chosen for this data; the best of Table 4's "
                         "grid (0.001-0.03) can be far better (docs/training.md: 46.5% vs 61.9%); --lr-sweep picks it")
    return Defaults(cfg.with_overrides(changes) if changes else cfg, notes, quick)


def resolution_note(image_size: tuple[int, int], explicit: bool) -> str:
    h, w = image_size
    if explicit:
        return f"resolution {h}x{w} (--image-size)"
    return (f"resolution {h}x{w}: the checkpoint's own; --image-size N fine-tunes at another (the paper steps "
            "up, 224 to 384: it pays when the images hold detail finer than the patches see, at ~3x the cost)")


def paper_step_up(image_size: tuple[int, int], stride: int) -> int:
    """The paper's step up from this resolution (224 -> 384), on the patch grid."""
    return max(stride, round(image_size[0] * RESOLUTION_STEP / stride) * stride)


SWEEP_FOLDER = ("sweep", "final", "sweep.json")  # what lr_sweep writes into its folder


def check_sweep_folder(out: Path) -> None:
    """Refuse, before any training, a folder that is not new, empty or a learning-rate sweep's:
    its runs and sweep.json would go among the user's files."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder for the learning-rate sweep")
    theirs = sorted(p.name for p in out.iterdir() if p.name not in SWEEP_FOLDER) if out.is_dir() else []
    if theirs:
        raise ConfigError(f"{out} exists and is not a vitlab run folder or learning-rate sweep (it holds "
                          f"{', '.join(theirs[:3])}); refusing to write into it: choose a new --out folder")


def lr_sweep(
    cfg: RunConfig,
    out: Path,
    grid: tuple[float, ...],
    train_fn: Callable[[RunConfig, Path], dict[str, Any]],
    log: Callable[[str], None] | None = None,
    sweep_steps: Optional[int] = None,
) -> dict[str, Any]:
    """Train once per learning rate on train-minus-dev, score on dev, retrain the best on train.

    `train_fn(config, run_folder) -> summary` runs one training (the Trainer). Each sweep run
    has its own folder under out/sweep/, so a stopped sweep resumes where it was.
    `sweep_steps` shortens the sweep runs (the quick sweep), their warm-up kept at 5%.
    """
    check_sweep_folder(out)
    log = log or say
    scores, counts = {}, {}
    short = {}
    if sweep_steps:
        short = {"train.steps": sweep_steps, "train.epochs": 0.0,
                 "optim.warmup_steps": min(cfg.optim.warmup_steps, max(1, round(WARMUP_SHARE * sweep_steps)))}
    for lr in grid:
        sweep_cfg = cfg.with_overrides(
            {"optim.lr": lr, "data.train_split": "train-minus-dev", "data.eval_splits": ["dev"], "data.eval_data": "",
             **short}
        )
        summary = train_fn(sweep_cfg, out / "sweep" / f"lr-{lr:g}")
        scores[lr], counts[lr] = summary["splits"]["dev"]["top1"], summary["splits"]["dev"]["count"]
        log(f"lr-sweep: lr {lr:g} -> dev top-1 {scores[lr]:.2%}")
    best = max(grid, key=lambda lr: (scores[lr], -lr))
    edge, noise = edge_note(grid, best), noise_note(scores, counts[best])
    log(f"lr-sweep: best lr {best:g}" + "".join(f"; {n}" for n in (edge, noise) if n)
        + "; training on the full training set")
    final = train_fn(cfg.with_overrides({"optim.lr": best}), out / "final")
    result = {"grid": list(grid), "dev_top1": {f"{k:g}": v for k, v in scores.items()}, "best_lr": best,
              "at_edge": bool(edge), "within_noise": bool(noise), "final": final}
    if distributed.is_main_process():
        atomic_write_text(out / "sweep.json", json.dumps(result, indent=2))
    return result


def edge_note(grid: tuple[float, ...], best: float) -> str:
    """A warning when the best rate is the grid's smallest or largest: the optimum may lie beyond."""
    if len(grid) < 2 or best not in (min(grid), max(grid)):
        return ""
    side, beyond = ("smallest", min(grid) / 3) if best == min(grid) else ("largest", max(grid) * 3)
    return (f"it is the grid's {side} rate, so a better one may lie beyond it: try --lr-grid with {beyond:.2g} "
            "on that side")


def noise_note(scores: dict[float, float], dev_count: int) -> str:
    """A warning when the best rate's dev score is within sampling noise of the runner-up's:
    two standard errors of the difference of two accuracies on `dev_count` images. The paper's
    dev splits (Table 4: 2% of CIFAR is 1,000 images) tell rates apart; a small dev split or
    runs too short to leave chance may not, and then the pick is a coin toss."""
    if len(scores) < 2 or dev_count < 1:
        return ""
    best, second = sorted(scores.values(), reverse=True)[:2]
    p = (best + second) / 2
    margin = 2 * math.sqrt(2 * p * (1 - p) / dev_count)
    if best - second > margin:
        return ""
    return (f"the best two dev scores ({best:.1%}, {second:.1%}) are within sampling noise of each other on "
            f"{dev_count} dev images (2 standard errors: {margin:.1%}), so the choice is uncertain: longer sweep "
            "runs (--lr-sweep) or a rate of your own (--lr) decide it")


@dataclass
class Plan:
    """A fine-tuning run decided: its config, folder and plan lines, and the learning-rate
    sweep before it (`sweep`; `sweep_steps` None for the full sweep, else the quick one's length)."""

    config: RunConfig
    out: Path
    notes: list[str]
    grid: tuple[float, ...]
    sweep: bool = False
    sweep_steps: Optional[int] = None
    arms: list[choice.Arm] = field(default_factory=list)  # the recipe sweep's; empty: the paper's lr sweep
    explicit: set[str] = field(default_factory=set)


def explicit_keys(options: Mapping[str, Any], overrides: Sequence[str] = (), paper_resolution: bool = False) -> set[str]:
    """The config keys the user set by option or SECTION.KEY=VALUE."""
    keys = {key for attr, key in EXPLICIT_OPTIONS.items() if options.get(attr) is not None}
    keys |= {o.split("=", 1)[0].strip() for o in overrides if "=" in o}
    return keys | ({"model.image_size"} if paper_resolution else set())


def lr_grid(row: Optional[str], rates: Optional[Sequence[float]] = None) -> tuple[float, ...]:
    """The rates a sweep tries: `rates` when given, else Table 4's for the dataset."""
    if rates is None:
        return TABLE4_LRS.get(row or "", DEFAULT_GRID)
    grid = tuple(float(r) for r in rates)
    if not grid or min(grid) <= 0:
        raise ConfigError(f"--lr-grid {','.join(f'{r:g}' for r in grid)!r}: give positive rates separated by commas")
    return grid


def _length(recipe: str, options: Mapping[str, Any], row: Optional[str], extra: dict, notes: list[str]) -> None:
    """Table 4's number of steps for the dataset, unless the user or the recipe set a length."""
    if row is not None and row not in TABLE4_STEPS:
        raise ConfigError(f"--table4 {row!r}: not a Table 4 dataset; use one of {', '.join(TABLE4_STEPS)}")
    if options.get("steps") is None and options.get("epochs") is None and load_recipe(recipe).train.steps == 0:
        if row is None:
            extra["train.steps"] = DEFAULT_STEPS
            notes.append(f"{DEFAULT_STEPS} steps: Table 4's count for its small datasets (--steps N to change)")
        else:
            extra["train.steps"] = TABLE4_STEPS[row]


def training_set(cfg: RunConfig) -> Any:
    """The run's training split (its length and `identity`: which paper dataset it is)."""
    arch = architecture(cfg.model)
    return open_dataset(cfg.data.name, cfg.data.train_split, model_transform(arch),
                        **({"dev_fraction": cfg.data.dev_fraction} if cfg.data.dev_fraction >= 0 else {}))


def plan(checkpoint: str, data: str, *, recipe: str = RECIPE, options: Mapping[str, Any] = {},
         overrides: Sequence[str] = (), paper_resolution: bool = False, lr_sweep: bool = False,
         rates: Optional[Sequence[float]] = None, table4: Optional[str] = None,
         out: Optional[Path | str] = None, choose: Optional[str] = None) -> Plan:
    """Fine-tuning `checkpoint` (a file vitlab.load reads, or a published name) on `data`, fitted
    to both; `options` and `overrides` as recipe.resolve takes them, `rates` the sweep's grid.
    `choose`: the fine-tuning recipe, "paper", "adamw" or "auto" (chosen on the dev split;
    see finetune_choice.py); None: auto with the shipped `finetune` recipe, the recipe's own
    ("paper") with any other, such as Table 2's."""
    choose = choose or ("auto" if recipe == RECIPE else "paper")
    if choose not in choice.CHOICES:
        raise ConfigError(f"--recipe {choose!r}: use one of {', '.join(choice.CHOICES)}")
    if not Path(checkpoint).exists() and not is_pretrained_name(checkpoint):
        raise ConfigError(f"--from {checkpoint}: no such file")
    if not data:
        raise ConfigError("--data is required: the dataset to fine-tune on (e.g. --data cifar10)")
    if paper_resolution and options.get("image_size"):
        raise ConfigError("--paper-resolution and --image-size both set the resolution: give one")
    extra: dict[str, Any] = {"model.checkpoint": checkpoint}
    notes: list[str] = []
    row = table4 or paper_dataset(data)
    grid = lr_grid(row, rates)
    _length(recipe, options, row, extra, notes)
    if table4:  # a declared Table 4 row declares the dataset, and so the paper's dev split
        extra["data.dev_fraction"] = DEV_FRACTIONS.get(table4, identity.DEFAULT_DEV_FRACTION)
    if paper_resolution:
        own = read_checkpoint(checkpoint).config
        extra["model.image_size"] = paper_step_up(own.image_size, own.total_stride)
    cfg, name = recipes.resolve(recipe, {**options, "data": data}, overrides, extra)
    explicit = explicit_keys(options, overrides, paper_resolution)
    threads, threads_note = choice.thread_policy(cfg, checkpoint, explicit)
    cfg = cfg.with_overrides(threads)
    train_set = training_set(cfg)
    out = Path(out) if out else Path("runs") / f"{name}-{Path(checkpoint).stem}"
    head = [resolution_note(architecture(cfg.model).image_size, "model.image_size" in explicit), threads_note]
    chosen = choice.resolved(choose, explicit, cfg)
    if chosen.name == "paper":  # the paper's protocol as it was: Table 4's rates, a quick sweep on small data
        fitted = fit_defaults(cfg, len(train_set), explicit, lr_sweep, TABLE4_STEPS.get(row or ""))
        sweep = lr_sweep or fitted.quick_sweep_steps is not None
        return Plan(fitted.config, out, [*head, *chosen.notes, *fitted.notes, *notes], grid, sweep,
                    fitted.quick_sweep_steps, explicit=explicit)
    fitted = fit_defaults(cfg, len(train_set), explicit, lr_sweep_asked=True)  # batch and length; warm-up per recipe
    t = fitted.config.train
    if not t.steps:  # --epochs: in steps, which the arms' length and the warm-up shares are of
        steps = max(1, math.ceil(t.epochs * (len(train_set) // t.batch_size)))
        fitted.config = fitted.config.with_overrides({"train.steps": steps, "train.epochs": 0.0})
    dev = identity.describe(getattr(train_set, "identity", None), cfg.data.dev_fraction)
    c = choice.decide(fitted.config, chosen, explicit, grid, rates, lr_sweep, dev)
    kept = [n for n in fitted.notes if not n.startswith("warm-up")]
    return Plan(c.config, out, [*head, *kept, *c.notes, *notes], grid, bool(c.arms), c.steps, c.arms, explicit)


def run(p: Plan, *, command: str = "", quiet: bool = False, trackers: Sequence[str] = (),
        log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Carry out a plan: the run alone (its summary), or the sweep and then the best rate on the
    whole training set (lr_sweep's result, with "best_lr" and the final run's summary)."""
    if not p.sweep:
        return recipes.train(p.config, p.out, command=command, quiet=quiet, notes=p.notes, trackers=trackers)
    check_sweep_folder(p.out)  # before the first sweep run, for both kinds of sweep
    (log or say)("\n  ".join(("fine-tuning defaults, for the sweep and the final run:", *p.notes)))
    if p.arms:
        def arm(c: RunConfig, o: Path, more: Sequence[str] = ()) -> dict[str, Any]:
            said = (f"sweep run: {o.name}, {c.train.steps} steps, scored on the dev split",) if o.parent.name == "sweep" \
                else (*p.notes, *more)
            return recipes.train(c, o, command=command, quiet=quiet, notes=said, trackers=trackers)

        steps = p.sweep_steps or p.config.train.steps
        return choice.choose(p.config, p.out, p.arms, steps, p.explicit, arm, log or say)

    def train(c: RunConfig, o: Path) -> dict[str, Any]:
        sweeping = o.parent.name == "sweep"
        said = (f"lr-sweep run: lr {c.optim.lr:g}, {c.train.steps} steps, scored on the dev split",) if sweeping else p.notes
        return recipes.train(c, o, command=command, quiet=quiet, notes=said, trackers=trackers)

    return lr_sweep(p.config, p.out, p.grid, train, log=log, sweep_steps=p.sweep_steps)


def done_line(p: Plan, result: Mapping[str, Any]) -> Optional[str]:
    """What `vitlab finetune` prints after a sweep: the pick, where the scores are, the compute."""
    if "best_recipe" in result:
        return (f"sweep done: {result['best_recipe']} at lr {result['best_lr']:g}; scores in {p.out / 'sweep.json'}; "
                f"final run in {p.out / 'final'}\nwith the sweep: {format_compute(result['compute_with_sweep'])}")
    if "best_lr" in result:
        return f"lr-sweep done: best lr {result['best_lr']:g}; scores in {p.out / 'sweep.json'}; final run in {p.out / 'final'}"
    return None
