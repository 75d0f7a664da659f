"""From a recipe and a user's settings to the config of a run, and what may change on resume.

    cfg = resolve(load_recipe("cifar10"), Given.of({"data.name": "wds:../shared/data/cifar10", "optim.lr": 3e-4}))
    summary = train(cfg, "runs/cifar10", Inputs())

A user's settings are a `Given`: each one in the config's own terms (SECTION.KEY and its
value), with how it was written, for the message that refuses it; the command line builds
one from its flags and SECTION.KEY=VALUE overrides (cli/common.given), and the library never
sees a flag. `resume_config` is the resume policy: a run continues with its own config; only
its length (extending it) and what RESUMABLE_CHANGES lists (checkpoints, workers, device,
threads) may change, and anything else is refused by name rather than ignored, since it would
change the numbers of a run half done.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from vitlab.checkpoints.peers import variant_config
from vitlab.config import ConfigError, RunConfig, parse_override
from vitlab.config.provenance import COMMAND_LINE, LIBRARY, Origin
from vitlab.files import check_writable
from vitlab.run_layout import RunLayout
from vitlab.train.inputs import Inputs
from vitlab.train.loop import EXTENDABLE, Trainer
from vitlab.train.run_folder import RESUMABLE_CHANGES, RunFolder

DEFAULT_RECIPE = "digits"

# Model keys kept when `model` swaps the variant: regularisation, not shape.
KEEP_WITH_MODEL = ("dropout", "attention_dropout", "drop_path")


@dataclass(frozen=True)
class Given:
    """What a user set over a recipe: each setting as (how it was written, SECTION.KEY, value),
    in the order given; `model` a variant that replaces the recipe's model section (keeping
    its dropout settings). Two settings of one key to different values are refused by name:
    neither may win without a word."""

    settings: tuple[tuple[str, str, Any], ...] = ()
    model: Optional[str] = None

    def __post_init__(self) -> None:
        first: dict[str, tuple[str, Any]] = {}
        for what, key, value in self.settings:
            if key in first and not _same(key, first[key][1], value):
                raise ConfigError(f"{first[key][0]} and {what} both set {key}: give one")
            first.setdefault(key, (what, value))

    @classmethod
    def of(cls, values: Mapping[str, Any] = {}, overrides: Sequence[str] = (), model: Optional[str] = None) -> Given:
        """Settings by key (`{"optim.lr": 0.01}`), then SECTION.KEY=VALUE strings."""
        return cls(tuple((f"{k}={v}", k, v) for k, v in values.items()) + tuple((o, *parse_override(o)) for o in overrides),
                   model)

    @property
    def values(self) -> dict[str, Any]:
        """SECTION.KEY -> value, for every key set."""
        return {key: value for _, key, value in self.settings}

    def written(self, key: str) -> Optional[str]:
        """How the user set `key` (`--lr`, `optim.lr=0.01`), None when they did not."""
        return next((what for what, k, _ in self.settings if k == key), None)


def _same(key: str, a: Any, b: Any) -> bool:
    """Whether two values of `key` are the same setting once read as its type (0.01 and 1e-2);
    a value the key cannot take is refused here, by its own message."""
    return RunConfig().with_overrides({key: a}) == RunConfig().with_overrides({key: b})


def resolve(base: RunConfig, given: Given = Given(), extra: Optional[Mapping[str, Any]] = None,
            extra_origins: Mapping[str, Origin] = {}) -> RunConfig:
    """A recipe (`base`, load_recipe's) + `extra` + the user's settings -> the run's config.
    `given.model` swaps the variant (keeping the recipe's dropout settings); a `data.name`
    drops the recipe's evaluation set, which belongs to its own data. Each value records its
    layer: the recipe's, `extra_origins[key]` for `extra` (a caller's own settings), the
    command line for the user's."""
    d = base.to_dict()
    values = given.values
    if given.model:
        keep = KEEP_WITH_MODEL if variant_config(given.model).kind == "vit" else ()  # a BiT ResNet has no dropout
        d["model"] = {"name": given.model, **{k: v for k, v in d["model"].items() if k in keep}}
    if "data.name" in values:
        d["data"]["eval_data"] = ""
    swapped = {"model.name": COMMAND_LINE} if given.model else {}  # --model: a section of its own
    cfg = RunConfig.from_dict(d).with_origins({
        **{k: v for k, v in base.origins.items() if not swapped or not k.startswith("model.") or k[6:] in KEEP_WITH_MODEL},
        **swapped, **({"data.eval_data": COMMAND_LINE} if "data.name" in values else {})})
    extra = extra or {}
    for layer in dict.fromkeys(extra_origins.get(k, LIBRARY) for k in extra):
        cfg = cfg.with_overrides({k: v for k, v in extra.items() if extra_origins.get(k, LIBRARY) == layer}, layer)
    cfg = cfg.with_overrides(values, COMMAND_LINE)
    if cfg.train.steps == 0 and cfg.train.epochs == 0:
        raise ConfigError("the recipe sets no length: pass --steps N or --epochs N")
    return cfg


def resume_config(run_dir: Path | str, given: Given = Given(), recipe: Optional[str] = None,
                  out: Optional[Path | str] = None) -> RunConfig:
    """The config of the run in `run_dir` with what may change on resume applied: the length
    (extending the run), checkpoints, workers, device and threads. A `recipe`, a `model`, an
    `out` other than `run_dir`, or any other setting is refused by name."""
    run_dir = Path(run_dir)
    if not RunLayout(run_dir).config.is_file():
        raise ConfigError(f"--resume {run_dir}: no config.yaml there; give a run folder written by vitlab train")
    changeable = RESUMABLE_CHANGES | EXTENDABLE
    refused = list(dict.fromkeys(what for what, key, _ in given.settings if key not in changeable))
    if recipe is not None:
        refused.insert(0, "--config")
    if given.model:
        refused.insert(0, "--model")
    if out and Path(out).resolve() != run_dir.resolve():
        refused.append("--out")
    if refused:
        may = f"--steps, --epochs, --ckpt-every, --workers, --device, --log, --quiet, {', '.join(sorted(RESUMABLE_CHANGES))}"
        raise ConfigError(f"--resume {run_dir} continues that run with its own config; {', '.join(refused)} would change it "
                          f"(only {may} may): start a new run with another --out")
    cfg = RunFolder(run_dir).read_config()  # a damaged config.yaml is one line naming it
    return cfg.with_overrides(given.values, COMMAND_LINE)


def train(cfg: RunConfig, out: Path | str, inputs: Inputs, *, command: str = "", quiet: bool = False,
          notes: Sequence[str] = (), trackers: Sequence[str] = (), extend: bool = False) -> dict[str, Any]:
    """One training run into `out` (its folder and checkpoints/ checked writable first: a resumed
    run writes into both, found now rather than at its next checkpoint) -> the run's summary.
    `inputs`: what the runs of one plan share, read once (train/inputs.py).
    Raises TrainingDiverged on a non-finite loss and BadImageError on an unreadable image."""
    out = Path(out)
    for folder in (out, RunLayout(out).checkpoints):
        check_writable(folder, folder=True)
    return Trainer(cfg, out, inputs, command=command, quiet=quiet, notes=tuple(notes), trackers=tuple(trackers),
                   extend=extend).run()
