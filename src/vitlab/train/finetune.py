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
grid, each rate trained for 5% of the steps, at least 10: finetune_choice.arm_steps) instead
of a fixed default.

`plan` turns `Settings` (a checkpoint, a dataset, the user's settings in the config's terms)
into all of that (the config, the run folder, the plan lines, the sweep) and reads the recipe,
the checkpoint and the training split once, into the `Inputs` every run of the plan reads
(train/inputs.py); `run` carries it out. `vitlab finetune` is these two calls:

    s = finetune.Settings("runs/cifar10/checkpoints/last.safetensors", "digits", Given.of({"train.steps": 200}))
    p = finetune.plan(s, Inputs())
    result = finetune.run(p)   # the final run's summary, or the sweep's result with "best_lr"
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from vitlab.checkpoints import is_pretrained_name, open_checkpoint, save
from vitlab.config import ConfigError, RunConfig, ViTConfig
from vitlab.config.model import grid_note
from vitlab.config.provenance import CHECKPOINT, COMMAND_LINE, PLAN
from vitlab.data import DEV_FRACTIONS, identity
from vitlab.files import on_disk
from vitlab.log import get_logger
from vitlab.train import build, finetune_choice as choice, recipe as recipes
from vitlab.train.compute import format_compute
from vitlab.train.finetune_choice import Plan
from vitlab.train.inputs import Inputs
from vitlab.train.recipe import Given

LOG = get_logger("train")

# Table 4: fine-tuning steps and the learning-rate grid per dataset.
TABLE4_STEPS = {"imagenet": 20_000, "cifar10": 10_000, "cifar100": 10_000, "pets": 500, "flowers": 500, "vtab": 2_500}
DEFAULT_GRID = (0.001, 0.003, 0.01, 0.03)  # Table 4's grid for every dataset but ImageNet and VTAB
TABLE4_LRS = {"imagenet": (0.003, 0.01, 0.03, 0.06), **dict.fromkeys(("cifar10", "cifar100", "pets", "flowers"), DEFAULT_GRID),
              "vtab": (0.01,)}
DEFAULT_STEPS = 500  # Table 4's count for its small datasets (Pets, Flowers), for data it does not list
SMALL_DATA = 20_000  # training sets up to this size get the quick learning-rate sweep by default
MIN_STEPS_PER_EPOCH = 4  # the batch leaves at least this many steps per epoch (Table 4's Flowers: 2,040 / 512)
RESOLUTION_STEP = 384 / 224  # the paper's step up: pre-trained at 224, fine-tuned at 384 (§3.2)
RECIPE = "finetune"  # the shipped recipe fine-tuning starts from
CURVE_POINTS = 20  # a run logs often enough for this many points on its learning curve (a short one: every step)


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
        notes.append(f"batch {t.batch_size}: the recipe's, kept as the paper keeps it on its smallest set (Flowers, 2,040 "
                     f"images); it runs as {t.batch_size // micro} micro-batches of {micro}, each at most a quarter of the "
                     f"{n_train:,} training images (gradient accumulation: the same update)")
    batch = changes.get("train.batch_size", t.batch_size)
    total = t.steps or max(1, math.ceil(t.epochs * (n_train // batch)))
    if "train.log_every" not in explicit and total < CURVE_POINTS * t.log_every:
        changes["train.log_every"] = every = max(1, total // CURVE_POINTS)
        notes.append(f"a log line every {'step' if every == 1 else f'{every} steps'}: {total // every} points on the learning curve "
                     f"(the recipe's every {t.log_every} would record {max(1, total // t.log_every)} in a {total}-step run)")
    cap = o.warmup_steps if total == table4_steps else choice.warmup(o.warmup_steps, total)
    if "optim.warmup_steps" not in explicit and o.warmup_steps > cap:
        changes["optim.warmup_steps"] = cap
        notes.append(f"warm-up {cap} step{'' if cap == 1 else 's'}: 5% of the {total} (the paper's 500 of 10,000); the recipe's "
                     f"{o.warmup_steps} would outlast the run")
    quick = None
    if not lr_sweep_asked and "optim.lr" not in explicit:
        if n_train <= SMALL_DATA:
            quick = choice.arm_steps(total)
            notes.append(f"learning rate: a quick sweep first, Table 4's grid, {quick} steps per rate on the "
                         "training set minus a dev split, scored on the dev split (--lr to skip it; --lr-sweep for the full one)")
        else:
            notes.append(f"learning rate {o.lr:g}: the recipe's, not chosen for this data; the best of Table 4's "
                         "grid (0.001-0.03) can be far better (docs/training.md: 46.5% vs 61.9%); --lr-sweep picks it")
    return Defaults(cfg.with_overrides(changes, PLAN) if changes else cfg, notes, quick)


def resolution_note(image_size: tuple[int, int], explicit: bool, stepped_from: Optional[tuple[int, int]] = None) -> str:
    h, w = image_size
    if stepped_from:
        return (f"resolution {h}x{w}: the paper's step up from the checkpoint's {stepped_from[0]}x{stepped_from[1]} "
                "(--paper-resolution: x384/224 on the patch grid, position embeddings resized)")
    if explicit:
        return f"resolution {h}x{w} (--image-size)"
    return (f"resolution {h}x{w}: the checkpoint's own; --image-size N fine-tunes at another (the paper steps "
            "up, 224 to 384: it pays when the images hold detail finer than the patches see, at ~3x the cost)")


def paper_step_up(image_size: tuple[int, int], stride: int) -> int:
    """The paper's step up from this resolution (224 -> 384), on the patch grid."""
    return max(stride, round(image_size[0] * RESOLUTION_STEP / stride) * stride)


@dataclass(frozen=True)
class Settings:
    """What a fine-tune is asked for, in the library's terms (cli/finetune.py makes it from the
    flags): the checkpoint (a file vitlab.load reads, or a published name), the data spec, the
    user's settings over the recipe (`given`, kept by the fitted defaults and every arm).
    `choose`: the fine-tuning recipe, "paper", "adamw" or "auto" (chosen on the dev split: see
    finetune_choice.py); None: auto with the shipped `finetune` recipe, the recipe's own
    ("paper") with any other, such as Table 2's. `rates`: the sweep's grid (None: Table 4's);
    `table4`: the Table 4 row whose protocol to run."""

    checkpoint: str
    data: str
    given: Given = Given()
    recipe: str = RECIPE
    choose: Optional[str] = None
    paper_resolution: bool = False
    lr_sweep: bool = False
    rates: Optional[tuple[float, ...]] = None
    table4: Optional[str] = None
    out: Optional[Path | str] = None

    @property
    def explicit(self) -> set[str]:
        """The config keys the user set, which the plan leaves as they are."""
        return set(self.given.values) | ({"model.image_size"} if self.paper_resolution else set())


def lr_grid(row: Optional[str], rates: Optional[Sequence[float]] = None) -> tuple[float, ...]:
    """The rates a sweep tries: `rates` when given, else Table 4's for the dataset."""
    if rates is None:
        return TABLE4_LRS.get(row or "", DEFAULT_GRID)
    grid = tuple(float(r) for r in rates)
    if not grid or min(grid) <= 0:
        raise ConfigError(f"--lr-grid {','.join(f'{r:g}' for r in grid)!r}: give positive rates separated by commas")
    return grid


def in_steps(cfg: RunConfig, n_train: int) -> RunConfig:
    """A length given in epochs (--epochs) as steps: what a sweep's arms and the warm-up shares
    are measured in (an arm trains on fewer images, and would take fewer steps an epoch)."""
    t = cfg.train
    if t.steps:
        return cfg
    steps = max(1, math.ceil(t.epochs * (n_train // t.batch_size)))
    return cfg.with_overrides({"train.steps": steps, "train.epochs": 0.0}, PLAN)


def check_checkpoint(checkpoint: str) -> None:
    """Refuse a checkpoint that is neither a file here nor a published name."""
    if not on_disk(checkpoint) and not is_pretrained_name(checkpoint):
        raise ConfigError(f"{checkpoint}: no such checkpoint file (give a file vitlab.load reads, or a published name)")


def random_start(checkpoint: str, seed: int, out: Optional[Path | str]) -> str:
    """The control arm of a transfer score (`vitlab finetune CHECKPOINT --random-init SEED`):
    the checkpoint's network at random initialisation (the seed's draw, its weights unread),
    written beside the run folder, so that the same fine-tuning starts from untrained weights
    and a pretraining gain is measured net of what the architecture alone reaches."""
    check_checkpoint(checkpoint)
    model, _ = open_checkpoint(checkpoint, random_init=seed)
    run = Path(out) if out else Path("runs") / f"finetune-{Path(checkpoint).stem}-random-init-{seed}"
    path = run.parent / f"{run.name}.random-init-{seed}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save(model, path)
    return str(path)


def _check(s: Settings, choose: str) -> None:
    """Refuse, before anything is read, what cannot run or would drop a setting silently."""
    if choose not in choice.CHOICES:
        raise ConfigError(f"--recipe {choose!r}: use one of {', '.join(choice.CHOICES)}")
    check_checkpoint(s.checkpoint)
    if not s.data:
        raise ConfigError("--data is required: the dataset to fine-tune on (e.g. --data cifar10)")
    if s.table4 is not None and s.table4 not in TABLE4_STEPS:
        raise ConfigError(f"--table4 {s.table4!r}: not a Table 4 dataset; use one of {', '.join(TABLE4_STEPS)}")
    if s.rates is not None:
        lr_grid(None, s.rates)  # an empty or non-positive grid, refused now
    size, rate = s.given.written("model.image_size"), s.given.written("optim.lr")
    if s.paper_resolution and size:
        raise ConfigError(f"--paper-resolution and {size} both set the resolution: give one")
    chooser = "--lr-sweep" if s.lr_sweep else "--lr-grid" if s.rates is not None else None
    if rate and chooser:
        raise ConfigError(f"{rate} and {chooser} both set the learning rate ({chooser} chooses it on the dev split): "
                          "give one")


def plan(s: Settings, inputs: Inputs) -> Plan:
    """Fine-tuning as `s` asks, fitted to the checkpoint and the data. The recipe, the
    checkpoint and the training split are read here, once, into `inputs` (the plan's, which
    its runs read; a given one is shared)."""
    # A declared Table 4 row, or another recipe (Table 2's), is the paper's protocol: no recipe choice unless asked.
    choose = s.choose or ("auto" if s.recipe == RECIPE and s.table4 is None else "paper")
    _check(s, choose)
    explicit = s.explicit
    extra: dict[str, Any] = {"model.checkpoint": s.checkpoint}
    layers = {"model.checkpoint": COMMAND_LINE, "train.steps": PLAN, "data.dev_fraction": COMMAND_LINE,
              "model.image_size": CHECKPOINT}  # --paper-resolution: the checkpoint's own, stepped up
    unset = not {"train.steps", "train.epochs"} & explicit and inputs.recipe(s.recipe).train.steps == 0
    if unset:  # Table 4's count for the dataset, once the data says which it is; this until then
        extra["train.steps"] = DEFAULT_STEPS
    if s.table4:  # a declared Table 4 row declares the dataset, and so the paper's dev split
        extra["data.dev_fraction"] = DEV_FRACTIONS.get(s.table4, identity.DEFAULT_DEV_FRACTION)
    own = inputs.checkpoint(s.checkpoint).config if s.paper_resolution else None
    if own is not None:
        # a ViT's on its patch grid; a ResNet (BiT) takes any size (it had no total_stride: AttributeError)
        extra["model.image_size"] = paper_step_up(own.image_size, own.total_stride if isinstance(own, ViTConfig) else 1)
    given = Given((*s.given.settings, (f"data.name={s.data}", "data.name", s.data)), s.given.model)
    cfg = recipes.resolve(inputs.recipe(s.recipe), given, extra, layers)
    threads, threads_note = choice.thread_policy(cfg, s.checkpoint, explicit, inputs)
    if inputs.source_config(s.checkpoint):  # else the recipe's own, as they are
        cfg = cfg.with_overrides(threads, CHECKPOINT)
    train_set = build.plain_training_set(cfg, build.architecture(cfg.model, inputs), None, inputs)  # its size and identity
    row = s.table4 or getattr(train_set, "identity", None)
    if unset and row in TABLE4_STEPS:
        cfg = cfg.with_overrides({"train.steps": TABLE4_STEPS[row]}, PLAN)
    arch = build.architecture(cfg.model, inputs)
    notes = [resolution_note(arch.image_size, "model.image_size" in explicit, own.image_size if own else None)
             + (f"; {grid_note(arch)}" if grid_note(arch) else ""), threads_note]
    out = Path(s.out) if s.out else Path("runs") / f"{Path(s.recipe).stem}-{Path(s.checkpoint).stem}"
    length = [f"{DEFAULT_STEPS} steps: Table 4's count for its small datasets (--steps N to change)"] \
        if unset and row not in TABLE4_STEPS else []
    chosen = choice.resolved(choose, explicit, cfg)
    grid = lr_grid(row, s.rates)
    if chosen[0] == "paper":  # the paper's protocol as it was: Table 4's rates, a quick sweep on small data
        fitted = fit_defaults(cfg, len(train_set), explicit, s.lr_sweep, TABLE4_STEPS.get(row or ""))
        swept = s.lr_sweep or fitted.quick_sweep_steps or s.rates is not None  # --lr-grid: a sweep of its rates
        arms = choice.arms("", grid) if swept else []
        config = in_steps(fitted.config, len(train_set)) if arms else fitted.config
        return Plan(config, out, [*notes, *chosen[1], *fitted.notes, *length], inputs, arms,
                    fitted.quick_sweep_steps, explicit)
    fitted = fit_defaults(cfg, len(train_set), explicit, lr_sweep_asked=True)  # batch and length; warm-up per recipe
    dev = identity.describe(getattr(train_set, "identity", None), cfg.data.dev_fraction)
    kept = [n for n in fitted.notes if not n.startswith("warm-up")]
    base = Plan(in_steps(fitted.config, len(train_set)), out, [*notes, *kept], inputs, explicit=explicit)
    p = choice.decide(base, chosen, grid, s.rates, s.lr_sweep, dev)
    p.notes += length
    return p


def run(p: Plan, *, command: str = "", quiet: bool = False, trackers: Sequence[str] = (),
        log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Carry out a plan: the run alone (its summary), or the sweep and then the best arm on the
    whole training set (finetune_choice.choose's result, with "best_lr" and the final run's
    summary). Every run reads the plan's inputs: nothing is read twice. `quiet`: the final
    run's summary only (the sweep's runs and lines say nothing; warnings still do)."""
    if not p.arms:
        return recipes.train(p.config, p.out, p.inputs, command=command, quiet=quiet, notes=p.notes, trackers=trackers)
    choice.check_sweep_folder(p.out)  # before the first sweep run
    log = (lambda _: None) if quiet else (log or say)
    log("\n  ".join(("fine-tuning defaults, for the sweep and the final run:", *p.notes)))

    def arm(c: RunConfig, o: Path, more: Sequence[str] = ()) -> dict[str, Any]:
        sweeping = o.parent.name == "sweep"
        said = (f"sweep run: {o.name}, {c.train.steps} steps, scored on the dev split",) if sweeping else (*p.notes, *more)
        with silenced(quiet and sweeping):
            return recipes.train(c, o, p.inputs, command=command, quiet=quiet, notes=said, trackers=trackers)

    steps = p.sweep_steps or p.config.train.steps
    return choice.choose(p.config, p.out, p.arms, steps, p.explicit, arm, log)


@contextlib.contextmanager
def silenced(quiet: bool) -> Iterator[None]:
    """vitlab.train's messages but warnings held back (a sweep run under --quiet says nothing,
    its summary included)."""
    level = LOG.level
    if quiet:
        LOG.setLevel(logging.WARNING)
    try:
        yield
    finally:
        LOG.setLevel(level)


def done_line(p: Plan, result: Mapping[str, Any]) -> Optional[str]:
    """What `vitlab finetune` prints after a sweep: the pick, where the scores are, the compute."""
    if "best_lr" not in result:
        return None
    pick = f"{result['best_recipe']} at lr {result['best_lr']:g}" if result["best_recipe"] else f"lr {result['best_lr']:g}"
    return (f"sweep done: {pick}; scores in {p.out / 'sweep.json'}; final run in {p.out / 'final'}\n"
            f"with the sweep: {format_compute(result['compute_with_sweep'])}")
