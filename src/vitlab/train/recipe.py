"""From a recipe and a user's settings to the config of a run, and what may change on resume.

    cfg, name = resolve("cifar10", {"data": "wds:../shared/data/cifar10", "lr": 3e-4}, ["model.dropout=0.1"])
    summary = train(cfg, "runs/cifar10")

`options` are named as `vitlab train`'s flags are (`batch_size` for --batch-size, ...):
FLAG_KEYS says which config key each sets. `overrides` are SECTION.KEY=VALUE strings,
applied after the options. `resume_config` is the resume policy: a run continues with its
own config; only its length (extending it) and what RESUMABLE_CHANGES lists (checkpoints,
workers, device, threads) may change, and anything else is refused by name rather than
ignored, since it would change the numbers of a run half done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from vitlab.checkpoints.peers import variant_config
from vitlab.config import ConfigError, RunConfig, load_recipe, parse_override
from vitlab.config.provenance import COMMAND_LINE, LIBRARY, Origin
from vitlab.config.run import AUGMENTATIONS
from vitlab.files import check_writable
from vitlab.run_layout import RunLayout
from vitlab.train.inputs import Inputs
from vitlab.train.loop import EXTENDABLE, Trainer
from vitlab.train.run_folder import RESUMABLE_CHANGES, RunFolder

DEFAULT_RECIPE = "digits"

# Model keys kept when `model` swaps the variant: regularisation, not shape.
KEEP_WITH_MODEL = ("dropout", "attention_dropout", "drop_path")

# Option -> the config key it sets (options whose value is the key's value).
FLAG_KEYS = {
    "data": "data.name", "image_size": "model.image_size", "batch_size": "train.batch_size",
    "micro_batch_size": "train.micro_batch_size", "lr": "optim.lr", "warmup_steps": "optim.warmup_steps",
    "seed": "train.seed", "ckpt_every": "train.ckpt_every", "eval_every": "train.eval_every",
    "workers": "data.num_workers", "skip_bad_images": "data.skip_bad_images", "ema": "train.ema",
    "compile": "train.compile", "grad_checkpointing": "train.grad_checkpointing", "device": "train.device",
    "objective": "train.objective", "mixup": "train.mixup", "cutmix": "train.cutmix",
    "label_smoothing": "train.label_smoothing", "drop_path": "model.drop_path",
    "train_fraction": "data.train_fraction", "train_size": "data.train_size", "antialias": "data.antialias",
}


def settings(options: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(flag as typed, config key, value) for every option given (not None), in FLAG_KEYS' order,
    then the ones that set more than one key or a key of their own value."""
    given = [(f"--{attr.replace('_', '-')}", key, options[attr]) for attr, key in FLAG_KEYS.items()
             if options.get(attr) is not None]
    if options.get("epochs") is not None:
        given += [("--epochs", "train.epochs", options["epochs"]), ("--epochs", "train.steps", 0)]
    if options.get("steps") is not None:
        given.append(("--steps", "train.steps", options["steps"]))
    for a in AUGMENTATIONS:  # --KEY VALUE, or --randaugment N M: one value per key of the augmentation
        value = options.get(a.option)
        if value is not None:
            values = value if len(a.keys) > 1 else [value]
            given += [(f"--{a.option.replace('_', '-')}", f"data.{key}", v) for key, v in zip(a.keys, values, strict=True)]
    for flag in ("bf16", "fp16"):
        if options.get(flag):
            given.append((f"--{flag}", "train.precision", flag))
    if options.get("fsdp"):
        given.append(("--fsdp", "train.parallel", "fsdp"))
    return given


def given_settings(options: Mapping[str, Any], overrides: Sequence[str] = ()) -> list[tuple[str, str, Any]]:
    """(flag or override as typed, config key, value) for every setting the user gave: the
    options (`settings`), then the SECTION.KEY=VALUE overrides. Two that set one key to
    different values are refused by name: neither may win without a word."""
    given = settings(options) + [(o, *parse_override(o)) for o in overrides]
    first: dict[str, tuple[str, Any]] = {}
    for what, key, value in given:
        if key in first and not _same(key, first[key][1], value):
            raise ConfigError(f"{first[key][0]} and {what} both set {key}: give one")
        first.setdefault(key, (what, value))
    return given


def _same(key: str, a: Any, b: Any) -> bool:
    """Whether two values of `key` are the same setting once read as its type (0.01 and 1e-2);
    a value the key cannot take is refused here, by its own message."""
    return RunConfig().with_overrides({key: a}) == RunConfig().with_overrides({key: b})


def option_overrides(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options as SECTION.KEY overrides (SECTION.KEY=VALUE strings are applied after them)."""
    return {key: value for _, key, value in settings(options)}


def resolve(recipe: Optional[str], options: Mapping[str, Any] = {}, overrides: Sequence[str] = (),
            extra: Optional[Mapping[str, Any]] = None, extra_origins: Mapping[str, Origin] = {}) -> tuple[RunConfig, str]:
    """Recipe + `extra` + options + overrides -> (RunConfig, recipe name). `options["model"]`
    swaps the variant (keeping the recipe's dropout settings); `options["data"]` drops the
    recipe's evaluation set, which belongs to its own data. Each value records its layer:
    the recipe's, `extra_origins[key]` for `extra` (a caller's own settings), the command
    line for options and overrides; an option and an override that disagree are refused."""
    name = recipe or DEFAULT_RECIPE
    given = given_settings(options, overrides)
    base = load_recipe(name)
    d = base.to_dict()
    if options.get("model"):
        keep = KEEP_WITH_MODEL if variant_config(options["model"]).kind == "vit" else ()  # a BiT ResNet has no dropout
        d["model"] = {"name": options["model"], **{k: v for k, v in d["model"].items() if k in keep}}
    if options.get("data"):
        d["data"]["eval_data"] = ""
    swapped = {"model.name": COMMAND_LINE} if options.get("model") else {}  # --model: a section of its own
    cfg = RunConfig.from_dict(d).with_origins({
        **{k: v for k, v in base.origins.items() if not swapped or not k.startswith("model.") or k[6:] in KEEP_WITH_MODEL},
        **swapped, **({"data.eval_data": COMMAND_LINE} if options.get("data") else {})})
    extra = extra or {}
    for layer in dict.fromkeys(extra_origins.get(k, LIBRARY) for k in extra):
        cfg = cfg.with_overrides({k: v for k, v in extra.items() if extra_origins.get(k, LIBRARY) == layer}, layer)
    cfg = cfg.with_overrides({key: value for _, key, value in given}, COMMAND_LINE)
    if cfg.train.steps == 0 and cfg.train.epochs == 0:
        raise ConfigError("the recipe sets no length: pass --steps N or --epochs N")
    return cfg, Path(name).stem


def resume_config(run_dir: Path | str, options: Mapping[str, Any] = {}, overrides: Sequence[str] = (),
                  recipe: Optional[str] = None, out: Optional[Path | str] = None) -> RunConfig:
    """The config of the run in `run_dir` with what may change on resume applied: the length
    (extending the run), checkpoints, workers, device and threads. A `recipe`, a `model`, an
    `out` other than `run_dir`, or any other option or override is refused by name."""
    run_dir = Path(run_dir)
    if not RunLayout(run_dir).config.is_file():
        raise ConfigError(f"--resume {run_dir}: no config.yaml there; give a run folder written by vitlab train")
    changeable = RESUMABLE_CHANGES | EXTENDABLE
    given = given_settings(options, overrides)
    refused = list(dict.fromkeys(flag for flag, key, _ in given if key not in changeable))
    if recipe is not None:
        refused.insert(0, "--config")
    if options.get("model"):
        refused.insert(0, "--model")
    if out and Path(out).resolve() != run_dir.resolve():
        refused.append("--out")
    if refused:
        allowed = "--steps, --epochs, --ckpt-every, --workers, --device, --log, --quiet"
        raise ConfigError(
            f"--resume {run_dir} continues that run with its own config; {', '.join(refused)} would change it. "
            f"On resume only {allowed} and {', '.join(sorted(RESUMABLE_CHANGES))} may change; for other settings "
            "start a new run with another --out"
        )
    cfg = RunFolder(run_dir).read_config()  # a damaged config.yaml is one line naming it
    return cfg.with_overrides({key: value for _, key, value in given}, COMMAND_LINE)


def default_out(recipe_name: str) -> Path:
    """Where a run of this recipe goes when no folder is named."""
    return Path("runs") / recipe_name


def check_resumable(out: Path) -> None:
    """`--resume` without a run folder needs a checkpoint in `out` to continue from."""
    if not RunLayout(out).last.exists():
        raise ConfigError(f"--resume: {out} has no checkpoint to continue from; drop --resume to start the run")


def train(cfg: RunConfig, out: Path | str, *, command: str = "", quiet: bool = False, notes: Sequence[str] = (),
          trackers: Sequence[str] = (), extend: bool = False, inputs: Optional[Inputs] = None) -> dict[str, Any]:
    """One training run into `out` (its folder and checkpoints/ checked writable first: a resumed
    run writes into both, found now rather than at its next checkpoint) -> the run's summary.
    `inputs`: what the runs of one plan share, read once (train/inputs.py).
    Raises TrainingDiverged on a non-finite loss and BadImageError on an unreadable image."""
    out = Path(out)
    for folder in (out, RunLayout(out).checkpoints):
        check_writable(folder, folder=True)
    return Trainer(cfg, out, command=command, quiet=quiet, notes=tuple(notes), trackers=tuple(trackers),
                   extend=extend, inputs=inputs).run()
