"""A sweep's spec: a grid of `vitlab train` runs, the commands run after each, the figures.

    # configs/paper/pos-embed.yaml
    train:                        # what every cell shares: `vitlab train` flags (a key
      config: cifar10             #   without a dot, `--key value`) and SECTION.KEY overrides
      epochs: 2
      optim.lr: 0.001
    grid:                         # the axes; the cells are their product
      model.pos_embed: [none, learned, learned_2d, relative, sincos_2d]
      seed: [0, 1, 2]
      size:                       # an axis of named bundles: each value sets several keys
        small: {model.depth: 4}
        base: {model.depth: 9, tag.family: ViT}   # tag.NAME: a label (a results column), no setting
    after:                        # more vitlab commands per cell, each writing one file
      fewshot:
        command: fewshot {checkpoint} --data cifar10 --shots 5 --out {cell}/fewshot.json
        result: fewshot.json
    scale: [epochs]               # what --scale S multiplies
    figures:
      - {file: pos_embed.png, kind: bar, x: model.pos_embed, y: test.top1}
    report:                       # the statistics of report.md / report.json (optional)
      metrics: [test.top1, fewshot.shots.5.mean]   # each arm's mean, std, 95% t interval
      pair_by: seed               # the axis whose cells are repeats (default seed)
      compare:                    # paired-by-seed differences a - b, with the verdict rule
        - {claim: "Table 8: a position embedding beats none", axis: model.pos_embed,
           a: learned, b: none, expect: higher}
        - {claim: "trained better than random", a: fewshot.shots.5.mean, b: init.shots.5.mean}
                                  # no axis: two columns of the same cells, per arm
        - {claim: "Fig. 9: equal at each one's best rate", axis: head, a: token, b: gap, expect: equal,
           margin: 0.01, best: lr, by: dev.top1,        # per side the rate with the best dev mean
           primary: {metric: fewshot.shots.5.mean, selection: "the rate, by dev top-1"}}
                                  # primary: the claim, declared before the run: the one row
                                  # (metric, `where` context) its verdict rests on, Holm-adjusted
                                  # within its family; sweep.json keeps its digest, the time and
                                  # the spec's git commit (vitlab.sweep.declare). A confirmatory
                                  # claim adds its power analysis: effect, sd (of the per-seed
                                  # difference, a pilot's), sd_from and family (Holm's m), and is
                                  # refused under 80% power unless exploratory: true

A random-init control (an after-step with `--random-init`) averages K >= 2 draws,
`--random-init {seed}00-{seed}04` (K = 5, each cell its own draws), so that its noise enters
each seed's difference and the interval; `vitlab sweep` refuses one draw unless the step says
why in `single_draw: "..."` (a fine-tune per draw, say). `vitlab sweep SPEC --redo-after STEP`
runs one after-step again on finished cells with the spec's command now (a control given more
draws), and records in sweep.json that the claims reading it are post hoc.

A command may use {checkpoint} (the cell's final weights), {best} (its best.safetensors, with
train.keep_best), {run} (its run folder), {cell} (its folder), {seed} (its training seed:
`inspect --random-init {seed}` draws a random-init baseline per seed) and {scaled:N}
(N x --scale, rounded, at least 1). Results are named as in results.csv: the train
summary's `test.top1`, `compute.train_flops`, ...; an after-step's
numbers under its name, `fewshot.shots.5.mean`; `A - B` is the difference of two columns and
`NAME[i]` one entry of a list column (`inspect.attention_distance.summary.mean_per_layer[0]`,
the first layer; `[-1]`, the last).
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Optional

from vitlab.config.fields import ConfigError, check_fields, check_keys, number, plain, setting
from vitlab.config.run import RECIPES, read_yaml
from vitlab.files import UnsafeNameError, check_name

FIGURE_KINDS = ("line", "pareto", "bar", "curve")
EXPECT = ("higher", "lower", "equal", "no higher", "no lower")  # each a rule of vitlab.sweep.stats.verdict
SHIPPED = RECIPES  # sweeps live one folder down: configs/paper/*.yaml


def _nonempty(v: str) -> Optional[str]:
    return None if v.strip() else "must not be empty"


def _name(v: str) -> Optional[str]:
    """A name that becomes a file or folder (a step's log, a figure, the default --out)."""
    try:
        check_name(v, "")
    except UnsafeNameError as e:
        return str(e).split(": ", 1)[-1]
    return None


def _relative(v: str) -> Optional[str]:
    """A path inside the cell folder: relative, no `..`, each part a plain name."""
    parts = PurePosixPath(v).parts
    if not v.strip() or v.startswith("/") or not parts or any(_name(p) for p in parts):
        return "must be a file inside the cell folder (e.g. fewshot.json), without '..' or a leading '/'"
    return None


# Commands an after-step may not run: serve never ends, push uploads, sweep would recurse.
NOT_AFTER = ("serve", "push", "sweep")


def check_value(value: Any, where: str) -> None:
    """A spec value vitlab can pass on: text, a finite number, a flag, null, or lists and
    mappings (with text keys) of those. NaN and infinity are refused here, not 3 hours into
    a run."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {value} is not a finite number; give a number")
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_value(v, f"{where}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str) or not k.strip():
                raise ConfigError(f"{where}: key {k!r} must be a non-empty text (quote it in the YAML)")
            check_value(v, f"{where}.{k}")
    elif not (value is None or isinstance(value, (str, int, float, bool))):
        raise ConfigError(f"{where}: {value!r} ({type(value).__name__}) is not a value a setting takes")


def first_wrong(*checks: tuple[object, str]) -> None:
    """Refuse with the first (wrong, message) check that is wrong: a spec's rules as a table."""
    for wrong, message in checks:
        if wrong:
            raise ConfigError(message)


def _mapping(d: dict, key: str, what: str) -> dict:
    value = d.get(key) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: give {what}, not a {type(value).__name__} ({str(value)[:60]})")
    check_value(value, key)
    return dict(value)


@dataclass(frozen=True)
class AfterStep:
    """A vitlab command run in a cell after training; done once `result` (in the cell) exists.
    A random-init control (`--random-init`) averages K >= 2 draws (`{seed}00-{seed}04`), so
    that its noise enters each seed's difference and the interval over seeds; a single draw
    is refused by a run unless `single_draw` says why one is enough (check_controls)."""

    name: str = setting("", check=_name)
    command: str = setting("", check=_nonempty)
    result: str = setting("", check=_relative)
    single_draw: str = ""  # why this step's random-init control may be one draw

    def __post_init__(self) -> None:
        check_fields(self, f"after.{self.name}")
        if self.name in ("train", "cell"):
            raise ConfigError(f"after.{self.name}: a step name is a plain word other than 'train' and 'cell'")
        try:
            words = shlex.split(self.command)
        except ValueError as e:
            raise ConfigError(f"after.{self.name}.command: {e} in {self.command!r}; fix the quoting") from None
        if not words or words[0] in NOT_AFTER:
            raise ConfigError(f"after.{self.name}.command: a step runs a vitlab command other than "
                              f"{', '.join(NOT_AFTER)} (e.g. fewshot {{checkpoint}} ...)")


def random_init_text(command: str) -> Optional[str]:
    """The value a command gives --random-init (`--random-init X` or `--random-init=X`), or None."""
    words = shlex.split(command)
    for i, w in enumerate(words):
        if w == "--random-init" and i + 1 < len(words):
            return words[i + 1]
        if w.startswith("--random-init="):
            return w.split("=", 1)[1]
    return None


def draw_count(text: str, seed: Any) -> Optional[int]:
    """How many random-init draws `text` (SEED or FIRST-LAST, {seed} standing for `seed`) makes;
    None when it is no number (the command itself refuses it when it runs)."""
    first, dash, last = text.replace("{seed}", str(seed)).partition("-")
    if not (first.isdigit() and (not dash or last.isdigit())):
        return None
    return int(last) - int(first) + 1 if dash else 1


def check_draws(step: "AfterStep", seeds: list[Any]) -> None:
    """A random-init control of one draw is refused unless the step says why (`single_draw`):
    its noise would be in no interval (one value stands for the control of every seed)."""
    text = random_init_text(step.command)
    counts = [n for n in (draw_count(text, s) for s in seeds) if n is not None] if text else []
    fewest = min(counts) if counts else None
    if fewest is not None and fewest < 2 and not step.single_draw.strip():
        raise ConfigError(f"after.{step.name}: a random-init control of one draw (--random-init {text}), whose noise "
                          "enters no interval; average K draws (--random-init {seed}00-{seed}04 for K = 5), or say why "
                          f"one is enough in after.{step.name}.single_draw")
    if step.single_draw and (fewest is None or fewest >= 2):
        what = f"draws {fewest}" if fewest else "draws no random init"
        raise ConfigError(f"after.{step.name}.single_draw: this step {what}; remove single_draw")


# A declared claim's keys: the one metric it is judged on (a results column or `A - B`); the one
# context of the pair it is judged in (axis: value; {} for none); how any choice in it is made
# (on dev, never on test, in words); the smallest difference that matters, in the metric's units;
# the s.d. of the per-seed difference a - b the power analysis assumes, and where it comes from;
# the confirmatory claims on the page (Holm's m: the power analysis plans for alpha/m); whether
# it is exploratory (run without a power requirement).
PRIMARY = ("metric", "where", "selection", "effect", "sd", "sd_from", "family", "exploratory")


def check_primary(primary: Mapping[str, Any], where: str, claim: str) -> None:
    """A declared claim (`primary:`) names its metric, context and selection rule before the run."""
    if not primary:
        return
    unknown = [k for k in primary if k not in PRIMARY]
    missing = [k for k in ("metric", "selection") if not str(primary.get(k) or "").strip()]
    if unknown or missing or not claim:
        wrong = [*(f"unknown {k}" for k in unknown), *(f"missing {k}" for k in missing), *([] if claim else ["no claim"])]
        raise ConfigError(f"{where}.primary: {', '.join(wrong)}; give {', '.join(PRIMARY)} (metric and selection required) and a claim")
    if not isinstance(primary.get("where", {}), Mapping):
        raise ConfigError(f"{where}.primary.where: give a mapping of axis: value")
    for key, hint in (("effect", "the smallest difference that matters, in the metric's units"),
                      ("sd", "the s.d. of the per-seed difference, in the metric's units")):
        if primary.get(key) is not None:
            number(primary[key], f"{where}.primary.{key}", above=0, hint=hint)
    if primary.get("family") is not None:
        number(primary["family"], f"{where}.primary.family", whole=True, at_least=1,
               hint="the number of confirmatory claims on the page (Holm's m)")
    if not isinstance(primary.get("exploratory", False), bool):
        raise ConfigError(f"{where}.primary.exploratory: give true or false")


@dataclass(frozen=True)
class FigureSpec:
    """One figure from results.csv.

    line:   y (mean and spread over the cells that differ only in other axes) against x,
            one line per value of `series`;
    pareto: every cell as a point of (x, y), and per series the front of points that no
            cheaper point beats (Fig. 5);
    bar:    y per value of x (categorical), mean, spread and every cell;
    curve:  y is a list per cell (e.g. a value per layer), drawn against its index.
    """

    file: str = setting("", check=_name)
    kind: str = setting("line", one_of=FIGURE_KINDS)
    x: str = ""
    y: str = setting("", check=_nonempty)
    series: str = ""
    where: Mapping[str, Any] = field(default_factory=dict)  # keep only rows with these values
    references: Mapping[str, str] = field(default_factory=dict)  # curve: label -> a results column, drawn dashed
    logx: bool = False
    logy: bool = False
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""

    def __post_init__(self) -> None:
        check_fields(self, f"figures[{self.file}]")
        if self.kind != "curve" and not self.x:
            raise ConfigError(f"figures[{self.file}]: a {self.kind} figure needs x (an axis or a results column)")
        if Path(self.file).suffix not in (".png", ".pdf", ".svg"):
            raise ConfigError(f"figures[{self.file}]: the file must end in .png, .pdf or .svg")


@dataclass(frozen=True)
class CompareSpec:
    """One compared pair: cells with `axis` = a against those with `axis` = b, paired by the
    report's pair_by axis and matched on every other axis (one comparison per combination of
    them, kept to `where`). `expect` is the paper's claim: a higher, lower, or equal to b
    (within `margin`, in the metric's units), or one-sided against the margin: "no higher" (a
    no better than b: a - b < +margin) or "no lower" (a - b > -margin); `metrics` default to
    the report's.

    Without `axis`, a and b are two results columns of the same cells (a trained model's
    first-layer distance against the same cell's random-init one, the last layer against the
    first): per arm, each seed's a against its own b."""

    axis: str = ""
    a: Any = None
    b: Any = None
    expect: str = setting("higher", one_of=EXPECT)
    margin: float = setting(0.0, at_least=0)
    claim: str = ""
    metrics: tuple[str, ...] = ()
    where: Mapping[str, Any] = field(default_factory=dict)
    # Equal cost instead of equal settings (Fig. 5's equal compute): each a cell against b's
    # metric at the same value of the results column `at` (compute.train_flops), read off the
    # same seed's b cells along the grid axis `along` (steps) by linear interpolation in
    # log10(at); an a cell outside b's range is not compared (no extrapolation).
    at: str = ""
    along: str = ""
    # Best against best: per side, the value of the grid axis `best` whose mean over seeds of
    # the results column `by` is highest (a dev split's score, never test), compared paired by seed.
    best: str = ""
    by: str = ""
    # The claim declared before the run (PRIMARY): the one row of this pair the page's verdict rests on.
    primary: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"report.compare[{self.claim or self.axis}]"
        check_fields(self, where)
        check_primary(self.primary, where, self.claim)
        what = f"values a and b of {self.axis}" if self.axis else "results columns a and b (or an axis and two of its values)"
        first_wrong(
            (bool(self.best) != bool(self.by) or (self.by and not self.axis), f"{where}: `best` (a grid axis, e.g. lr) and `by` "
             "(the dev column that picks its value, e.g. dev.top1) go together, with an axis"),
            (self.by and any(w.startswith("test") for w in self.by.replace(" - ", " ").split()),
             f"{where}.by: {self.by} is a test score; select on a dev split (e.g. dev.top1), never on test"),
            (self.a is None or self.b is None or str(self.a) == str(self.b), f"{where}: give two different {what}"),
            (not self.axis and (self.at or self.metrics or self.where), f"report.compare[{self.claim or self.a}]: a and b are "
             "results columns here (no `axis`); `at`, `metrics` and `where` need an axis"),
            (bool(self.at) != bool(self.along), f"{where}: `at` (a results column, e.g. compute.train_flops) and `along` "
             "(the grid axis that moves it, e.g. steps) go together"))


@dataclass(frozen=True)
class SlopeSpec:
    """A fitted line of `y` against `x` (log10 x with `logx`) per value of `by` (Fig. 5's
    accuracy against log-compute, per family), every finished cell a point: the slope with
    its 95% t interval."""

    x: str = setting("", check=_nonempty)
    y: str = setting("", check=_nonempty)
    by: str = ""
    logx: bool = True
    # Optionally two groups of `by` compared: each seed's slope of a against the same seed's
    # slope of b, paired by seed, with the verdict rule ("ViT's slope is steeper than BiT's").
    a: Any = None
    b: Any = None
    expect: str = setting("higher", one_of=EXPECT)
    claim: str = ""
    primary: Mapping[str, Any] = field(default_factory=dict)  # as CompareSpec.primary

    def __post_init__(self) -> None:
        check_fields(self, f"report.slopes[{self.y} ~ {self.x}]")
        check_primary(self.primary, f"report.slopes[{self.y} ~ {self.x}]", self.claim)
        if (self.a is None) != (self.b is None) or (self.a is not None and (not self.by or str(self.a) == str(self.b))):
            raise ConfigError(f"report.slopes[{self.y} ~ {self.x}]: to compare slopes give `by` and two different "
                              "groups a and b of it")


@dataclass(frozen=True)
class ReportSpec:
    """What report.md and report.json hold: per arm (the cells that differ only in pair_by)
    each metric's mean, std and 95% t interval; per compared pair the paired differences."""

    metrics: tuple[str, ...] = ("test.top1",)
    pair_by: str = setting("seed", check=_nonempty)
    compare: tuple[CompareSpec, ...] = ()
    slopes: tuple[SlopeSpec, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self, "report")

    @classmethod
    def from_dict(cls, d: Any) -> "ReportSpec":
        d = check_keys(cls, d or {}, "report")
        for key, spec, keys in (("compare", CompareSpec, "{axis, a, b, expect}"), ("slopes", SlopeSpec, "{x, y, by}")):
            given = d.get(key) or ()
            if not isinstance(given, (list, tuple)):
                raise ConfigError(f"report.{key}: give a list of {keys} mappings")
            d[key] = tuple(spec(**check_keys(spec, item or {}, f"report.{key}")) for item in given)
        return cls(**d)


@dataclass(frozen=True)
class SweepSpec:
    """The whole sweep; `name` defaults to the spec file's name."""

    name: str = setting("sweep", check=_name)
    train: Mapping[str, Any] = field(default_factory=dict)
    grid: Mapping[str, Any] = field(default_factory=dict)
    after: tuple[AfterStep, ...] = ()
    scale: tuple[str, ...] = ()
    figures: tuple[FigureSpec, ...] = ()
    report: ReportSpec = field(default_factory=ReportSpec)
    # A diverging loss (vitlab.train.report.Divergence) stops a cell's step unless this is true.
    allow_divergence: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "sweep")
        for what, value in (("train", self.train), ("grid", self.grid)):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{what}: give a mapping, not a {type(value).__name__}")
            check_value(dict(value), what)
        for key in ("out", "resume"):
            if key in self.train:
                raise ConfigError(f"train.{key}: the sweep chooses each cell's run folder itself; remove it")
        for axis, values in self.grid.items():
            if isinstance(values, dict):
                if not values or not all(isinstance(v, dict) for v in values.values()):
                    raise ConfigError(f"grid.{axis}: a bundle axis maps each label to a mapping of settings")
            elif not isinstance(values, list) or not values:
                raise ConfigError(f"grid.{axis}: give a list of values (or a mapping of labels to settings)")
        known = set(self.train) | set(self.grid) | {k for v in self.grid.values() if isinstance(v, dict)
                                                    for b in v.values() for k in b}
        for c in self.report.compare:
            # A side that names no value of its axis would compare nothing, silently.
            values = self.grid.get(c.axis)
            labels = [str(v) for v in (values if isinstance(values, list) else values or ())]
            for side in (c.a, c.b):
                if labels and str(side) not in labels:
                    raise ConfigError(f"report.compare[{c.claim or c.axis}]: {side!r} is not a value of grid.{c.axis} "
                                      f"({', '.join(labels)})")
            first_wrong(*((getattr(c, k) not in ("", *self.grid), f"report.compare[{c.claim or c.axis}].{k}: {getattr(c, k)} is "
                           f"not a grid axis (the axes: {', '.join(self.grid)})") for k in ("best", "along")))
        specs: tuple[CompareSpec | SlopeSpec, ...] = (*self.report.compare, *self.report.slopes)
        texts = [c.claim for c in specs if c.primary]
        if len(set(texts)) != len(texts):
            raise ConfigError("report: two declared claims (`primary`) share a claim text; give each its own")
        missing = [k for k in self.scale if k not in known]
        if missing:
            raise ConfigError(f"scale: {', '.join(missing)} is set nowhere in train or grid; scale only keys you set")

    @classmethod
    def from_dict(cls, d: Any, name: str) -> "SweepSpec":
        if not isinstance(d, dict):
            raise ConfigError(f"a sweep spec must be a mapping with train, grid, after, scale, figures; got {d!r}")
        d = check_keys(cls, d, "")
        after = _mapping(d, "after", "a mapping of each step's name to {command: ..., result: ...}")
        steps = tuple(AfterStep(name=k, **check_keys(AfterStep, v or {}, f"after.{k}")) for k, v in after.items())
        figures, scale = d.get("figures") or (), d.get("scale") or ()
        first_wrong((not isinstance(figures, (list, tuple)), "figures: give a list of figures, each {file: ..., kind: ..., x: ..., y: ...}"),
                    (not isinstance(scale, (list, tuple)) or not all(isinstance(k, str) for k in scale),
                     "scale: give a list of the keys --scale multiplies, e.g. [epochs]"))
        check_value(figures, "figures")
        return cls(name=d.get("name") or name, train=_mapping(d, "train", "a mapping of `vitlab train` settings (key: value)"),
                   grid=_mapping(d, "grid", "a mapping of each axis to its list of values (grid: {seed: [0, 1]})"), after=steps, scale=tuple(scale),
                   figures=tuple(FigureSpec(**check_keys(FigureSpec, f or {}, "figures")) for f in figures),
                   report=ReportSpec.from_dict(d.get("report")), allow_divergence=d.get("allow_divergence", False))

    def to_dict(self) -> dict[str, Any]:
        """The spec as from_dict reads it (a sweep folder keeps it in sweep.json)."""
        d = plain(self)
        d["after"] = {a.pop("name"): a for a in d["after"]}
        return d


def declared_claims(spec: SweepSpec) -> list[dict[str, Any]]:
    """The claims a spec declares (its pairs and slopes with `primary`): text, direction or
    margin, metric, context, selection rule and effect, in the spec's order."""
    out = []
    specs: tuple[CompareSpec | SlopeSpec, ...] = (*spec.report.compare, *spec.report.slopes)
    for c in specs:
        if c.primary:
            margin = getattr(c, "margin", 0.0)
            out.append({"claim": c.claim, "a": c.a, "b": c.b, "expect": c.expect, "margin": margin,
                        **{k: c.primary.get(k, {} if k == "where" else None) for k in PRIMARY
                           if k in c.primary or k in ("metric", "where", "selection", "effect")}})
    return out


def check_controls(spec: SweepSpec) -> None:
    """Refuse, before a run, an after-step whose random-init control is one draw for some seed
    of the grid and does not say why (check_draws). A run's check, not the spec's: the folders
    run before it keep specs without `single_draw`, and their reports still rebuild."""
    seeds = spec.grid.get("seed", [spec.train.get("seed", 0)])
    for step in spec.after:
        check_draws(step, list(seeds) if isinstance(seeds, (list, dict)) else [seeds])


def claims_digest(spec: SweepSpec) -> str:
    """sha256 of the declared claims, as a sweep folder records them before its first cell runs."""
    text = json.dumps(declared_claims(spec), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def shipped_sweeps() -> list[str]:
    return sorted(str(p.relative_to(SHIPPED).with_suffix("")) for p in SHIPPED.glob("*/*.yaml"))


def load_sweep(path_or_name: str) -> tuple[SweepSpec, Path]:
    """A spec file, or a shipped one by name ("paper/pos-embed"); returns it and its path."""
    d, path = read_yaml(path_or_name, SHIPPED, "sweep spec", shipped_sweeps())
    try:
        return SweepSpec.from_dict(d, path.stem), path
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}", reason=e.reason) from None
