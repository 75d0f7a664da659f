"""A training run's configuration: model, data, optim, train and objective sections.

A run is read from a YAML recipe, changed by "section.key=value" overrides, and written back
as the resolved `config.yaml` of the run folder. Defaults live in these dataclasses only.

Each value remembers the layer that set it (`RunConfig.origins`, "section.key" -> a typed
`Origin`; a key it lacks is the default): the recipe or config file it was read from, the
command line, the checkpoint, the fine-tune's plan or sweep (config/provenance.py, which also
writes them into config.yaml as data and reads them back).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from vitlab import suggest
from vitlab.config.device import form_problem
from vitlab.config.fields import SEED_RANGE, ConfigError, check_fields, check_keys, check_type, from_text, hints, plain, section_from_text, setting
from vitlab.config.model import BiTConfig, ViTConfig, as_pair
from vitlab.config.mpp import MPPConfig
from vitlab.config.provenance import DEFAULT, LIBRARY, SECTION as PROVENANCE, Origin, config_file, recipe
from vitlab.files.documents import on_disk, read_yaml as read_yaml_file

OPTIMIZERS = ("adamw", "adam", "sgd")
DECAYS = ("cosine", "linear", "constant")
PRECISIONS = ("fp32", "bf16", "fp16")
PARALLEL = ("ddp", "fsdp")
# Signals train.stop_signals may name: each stops a run at the next step boundary with a
# checkpoint (vitlab.train.preemption); data-loader workers ignore them all (vitlab.data.loader).
STOP_SIGNALS = ("TERM", "USR1", "USR2", "HUP")
RECIPES = Path(__file__).resolve().parent.parent / "configs"
HEAD_STARTS = ("zeros", "probe")  # model.head_start: how a fine-tune's new head starts
# The inception crop's area range: vision_transformer's input_pipeline.py (and big_vision's
# inception_crop) samples 5% to 100% of the image, not torchvision's 8%.
CROP_SCALE = (0.05, 1.0)
# The training geometry (data.crop): "inception", the random crop of crop_scale/crop_ratio
# (the paper's pre-training and fine-tuning), or "whole", the whole image resized to the
# model's size, as task_adaptation's VTAB pipeline and the evaluation squash take it (no crop:
# an inception crop of scale [1, 1] is still a crop, the central square of a non-square image).
CROPS = ("inception", "whole")
SHUFFLE_BUFFER = 2000  # samples a streamed (wds) training set holds for shuffling: data.shuffle_buffer


def _crop_range(v: tuple[float, float]) -> Optional[str]:
    return None if 0 < v[0] <= v[1] <= 1 else "must be (low, high) with 0 < low <= high <= 1"


def _ratio_range(v: tuple[float, float]) -> Optional[str]:
    return None if 0 < v[0] <= v[1] else "must be (low, high) with 0 < low <= high"


def _signal_names(v: tuple[str, ...]) -> Optional[str]:
    bad = [name for name in v if name not in STOP_SIGNALS]
    return f"{', '.join(bad)}: not one of {', '.join(STOP_SIGNALS)} (signal names without SIG)" if bad else None


# A model section's changes may name a field of either model kind; the variant it names
# decides which apply (a BiT ResNet has no patch_size: building it says so).
_VIT_FIELDS = [f.name for f in fields(ViTConfig)]
_MODEL_EXTRA = ("name", "checkpoint", *(f.name for f in fields(BiTConfig) if f.name not in _VIT_FIELDS))


def _model_hint(key: str) -> Any:
    return hints(ViTConfig if key in _VIT_FIELDS else BiTConfig)[key]


@dataclass(frozen=True)
class ModelSection:
    """Which network a run trains: a registered variant (`vitlab models`) or the one a
    checkpoint holds (fine-tuning), with any field of its config changed (ViTConfig, or
    BiTConfig for a BiT ResNet). In a recipe the changes sit beside `name` and `checkpoint`:
    `model: {name: ViT-Ti/4, depth: 4, dropout: 0.1}`, `model: {name: BiT-R26-C, layers: [1, 1, 1, 1]}`."""

    name: str = "ViT-Ti/4"  # "" when the network comes from `checkpoint`
    checkpoint: str = ""  # start from these weights; the head is replaced for the new classes
    changes: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # config fields
    # The new head of a fine-tune (with `checkpoint`): "zeros", the paper's (§3.2), or "probe",
    # the logistic regression `vitlab linear-probe` fits on the frozen features of the training
    # images (train/probe_head.py).
    head_start: str = "zeros"

    def __post_init__(self) -> None:
        check_fields(self, "model")
        if not self.name and not self.checkpoint:
            raise ConfigError("the model section needs a name (a variant, see `vitlab models`) or a checkpoint")
        if self.head_start not in HEAD_STARTS:
            raise ConfigError(f"model.head_start={self.head_start!r}: use one of {', '.join(HEAD_STARTS)}")
        if self.head_start == "probe" and not self.checkpoint:
            raise ConfigError("model.head_start=probe fits a pretrained model's head: it needs model.checkpoint (vitlab finetune)")
        check_keys(ViTConfig, dict(self.changes), "model", extra=_MODEL_EXTRA)
        changes = dict(self.changes)
        if "image_size" in changes:
            changes["image_size"] = as_pair(changes["image_size"])
        changes = {k: check_type(v, _model_hint(k), f"model.{k}") for k, v in changes.items()}
        object.__setattr__(self, "changes", changes)

    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> "ModelSection":
        d = dict(check_keys(ViTConfig, {} if d is None else d, "model", extra=(*_MODEL_EXTRA, "head_start")))
        name = d.pop("name", "" if d.get("checkpoint") else cls.name)
        checkpoint = d.pop("checkpoint", cls.checkpoint)
        head_start = d.pop("head_start", cls.head_start)
        changes = {k: from_text(v, _model_hint(k)) for k, v in d.items()}
        return cls(name=name or "", checkpoint=checkpoint or "", changes=changes,
                   head_start=str(head_start or cls.head_start))

    def to_dict(self) -> dict[str, Any]:
        head = {k: v for k, v in (("name", self.name), ("checkpoint", self.checkpoint)) if v}
        # The default is left out, so that the configs of earlier runs read back the same.
        start = {"head_start": self.head_start} if self.head_start != ModelSection.head_start else {}
        return {**head, **start, **self.changes}


AUTOAUGMENT_POLICIES = ("", "imagenet", "cifar10", "svhn")  # torchvision.transforms.AutoAugmentPolicy


def every_unknown(d: Mapping[str, Any]) -> None:
    """Unknown keys in more than one place of a recipe are refused together, each with its near
    key (one alone gets the section's check and its list of valid keys)."""
    known = {"model": {*(f.name for f in fields(ViTConfig)), *_MODEL_EXTRA, "head_start"},
             **{k: {f.name for f in fields(c)} for k, c in SECTIONS.items()}}
    given = {k: v for k in known if isinstance(v := d.get(k), dict)}
    every = [f"{k}.{key}" for k, v in given.items() for key in v]
    unknown = [key for key in every if key.split(".", 1)[1] not in known[key.split(".", 1)[0]]]
    if len(unknown) > 1:
        names = [f"{k}.{key}" for k, keys in known.items() for key in keys]
        said = [f"{key} ({'did you mean ' + near[0] + '?' if near else 'no near key'})"
                for key in unknown for near in [suggest.close_key(key, names)]]
        raise ConfigError(f"unknown keys {', '.join(said)}", reason="unknown-key")


@dataclass(frozen=True)
class Augmentation:
    """One augmentation after the Inception crop and flip: the data section's keys it reads
    (the first turns it on: 0, "" or false is off), the torchvision transform that does it
    (`op`, a class of torchvision.transforms) with the key of each of its arguments, how a
    model card names it, and the arguments of its command-line flag (--KEY). `on_float`: it
    runs on the normalised float image, after the rest. Adding an augmentation is a row here
    and its fields in DataConfig; vitlab.data.augment builds it, the command line and the model
    card read this table."""

    keys: tuple[str, ...]
    op: str
    args: Mapping[str, str]
    words: str
    flag: Mapping[str, Any]
    on_float: bool = False

    @property
    def option(self) -> str:
        return self.keys[0]


AUGMENTATIONS = (
    Augmentation(("randaugment", "randaugment_magnitude"), "RandAugment",
                 {"num_ops": "randaugment", "magnitude": "randaugment_magnitude"}, "RandAugment ops",
                 dict(type=int, nargs=2, metavar=("N", "M"), help="RandAugment: N ops of magnitude M per image (DeiT 2 9)")),
    Augmentation(("autoaugment",), "AutoAugment", {"policy": "autoaugment"}, "AutoAugment policy",
                 dict(metavar="POLICY", choices=AUTOAUGMENT_POLICIES[1:], help="torchvision's AutoAugment with this policy")),
    Augmentation(("trivialaugment",), "TrivialAugmentWide", {}, "TrivialAugment",
                 dict(action="store_true", default=None, help="torchvision's TrivialAugmentWide")),
    Augmentation(("augmix",), "AugMix", {"severity": "augmix"}, "AugMix severity",
                 dict(type=int, nargs="?", const=3, metavar="SEVERITY", help="torchvision's AugMix, severity 1-10, default 3")),
    Augmentation(("random_erasing",), "RandomErasing", {"p": "random_erasing"}, "random erasing",
                 dict(type=float, metavar="P", help="torchvision's RandomErasing on a share P of the images"), on_float=True),
)


# Every data spec a command takes (`--data`), as its help and the unknown-spec error list them.
DATA_SPECS = ("digits | fashion-mnist[:DIR] | cifar10[:DIR] | cifar100[:DIR] | imagefolder:PATH | imagenet-val:DIR | "
              "vtab:TASK:ROOT | wds:PATTERN | hf:NAME (a Hugging Face dataset) | synthetic:TASK")


@dataclass(frozen=True)
class DataConfig:
    """Where the images come from and how they are augmented (§4.1, Appendix B.1)."""

    name: str = "digits"  # a spec for vitlab.data.open_dataset: digits, cifar10:DIR, wds:PATTERN, ...
    train_split: str = "train"
    eval_splits: tuple[str, ...] = ("test",)
    eval_data: str = ""  # another spec for evaluation (e.g. the test shards of a wds set); "" = name
    num_workers: int = setting(0, at_least=0)
    # How training images are decoded: "fast" decodes a JPEG only at the scale its crop needs and
    # keeps uint8 until the training process normalises it; "pil" decodes in full (the float
    # transform); "cuda" decodes and augments on the GPU (vitlab.data.decode).
    decode: str = setting("fast", one_of=("fast", "pil", "cuda"))
    eval_decode: str = setting("pil", one_of=("pil", "fast"), hint="fast: reduced-scale JPEG decoding, opt-in")
    # The training geometry (CROPS); the inception crop's area and aspect-ratio ranges.
    crop: str = setting("inception", one_of=CROPS, hint="whole: the whole image resized, no crop")
    crop_scale: tuple[float, float] = setting(CROP_SCALE, check=_crop_range)
    crop_ratio: tuple[float, float] = setting((0.75, 1.3333333333333333), check=_ratio_range)
    hflip: bool = True
    # Whether a shrinking resize (training and evaluation) filters first, as PIL and torchvision
    # do; False samples as TF's tf.image.resize does by default (the official input pipelines).
    # Measured on CIFAR-10 (docs/reproducing.md, "Antialiased resizing").
    antialias: bool = True
    randaugment: int = setting(0, at_least=0, hint="RandAugment ops per image; 0 = off")
    randaugment_magnitude: int = setting(9, at_least=0, at_most=30)
    # torchvision's other learned-policy augmentations, and random erasing after normalising.
    autoaugment: str = setting("", one_of=AUTOAUGMENT_POLICIES, hint="AutoAugment's policy; \"\" = off")
    trivialaugment: bool = False  # TrivialAugmentWide: one random op of random magnitude per image
    augmix: int = setting(0, at_least=0, at_most=10, hint="AugMix severity (torchvision's default 3); 0 = off")
    random_erasing: float = setting(0.0, at_least=0, at_most=1, hint="the share of images given an erased box")
    # Held-out dev share; < 0: the dataset's paper value (2% of CIFAR, 1% of ImageNet, 10% else).
    dev_fraction: float = setting(-1.0, below=1)
    skip_bad_images: bool = False
    shuffle_buffer: int = setting(SHUFFLE_BUFFER, at_least=0)  # samples held for shuffling a streamed (wds) set
    classes: tuple[str, ...] = ()  # class names of a wds set (else classes.txt beside the shards, else 0..K-1)
    # Train on a fixed, class-balanced part of the training split (the paper's 9M/30M/90M JFT
    # subsets, §4.3): a share of it, or a number of images. The part depends on subset_seed
    # alone, not on train.seed or the process count; a smaller part is inside a larger one.
    train_fraction: float = setting(1.0, above=0, at_most=1)
    train_size: int = setting(0, at_least=0, hint="images; 0 = the whole split (or train_fraction of it)")
    subset_seed: int = setting(0, **SEED_RANGE)

    def __post_init__(self) -> None:
        check_fields(self, "data")
        if self.classes and (len(self.classes) < 2 or len(set(self.classes)) != len(self.classes)):
            # One class trains to 100% with loss 0; a name twice makes two labels print alike.
            raise ConfigError(f"data.classes={list(self.classes)!r}: give two or more distinct class names, or leave the key out")
        on = [a.option for a in AUGMENTATIONS if getattr(self, a.option)]
        if self.decode == "cuda" and on:
            raise ConfigError(f"data.{on[0]}={getattr(self, on[0])!r} runs on the CPU and data.decode=cuda augments on the "
                              f"GPU; use data.decode=fast with {on[0]}")
        if self.train_size and self.train_fraction < 1:
            raise ConfigError(f"data.train_size={self.train_size} and data.train_fraction={self.train_fraction:g}: set one of them")


@dataclass(frozen=True)
class OptimConfig:
    """Optimiser and learning-rate schedule (Appendix B.1, Table 3 and 4)."""

    name: str = setting("adamw", one_of=OPTIMIZERS)  # adamw (decoupled weight decay), adam, sgd
    lr: float = setting(1e-3, above=0)
    betas: tuple[float, float] = setting((0.9, 0.999), check=lambda b: None if all(0 <= x < 1 for x in b) else "must be in [0, 1)")
    eps: float = setting(1e-8, above=0)
    momentum: float = setting(0.9, at_least=0, below=1)  # sgd only
    weight_decay: float = setting(0.0, at_least=0)  # applied to matrices only (dim >= 2, not embeddings or tokens)
    clip_grad_norm: float = setting(1.0, at_least=0, hint="global norm; 0 = off")
    warmup_steps: int = setting(0, at_least=0)  # linear warm-up from 0
    decay: str = setting("cosine", one_of=DECAYS)  # after warm-up: cosine or linear to end_lr, or constant
    end_lr: float = setting(0.0, at_least=0)

    def __post_init__(self) -> None:
        check_fields(self, "optim")


@dataclass(frozen=True)
class EarlyStopConfig:
    """Stop when `metric` (SPLIT.NAME of an evaluation split, e.g. dev.top1) has not improved
    by more than `min_delta` for `patience` evaluations (every train.eval_every steps)."""

    metric: str = ""  # "" = off
    patience: int = setting(5, at_least=1, hint="evaluations without improvement before stopping")
    min_delta: float = setting(0.0, at_least=0)
    mode: str = setting("auto", one_of=("auto", "max", "min"))  # auto: min for a loss, max otherwise

    def __post_init__(self) -> None:
        check_fields(self, "train.early_stop")


@dataclass(frozen=True)
class TrainConfig:
    """The loop: length, batch, checkpoints, precision, regularisers, objective."""

    objective: str = setting("supervised", check=lambda v: None if v in OBJECTIVE_OPTIONS
                             else f"not an objective; known: {', '.join(OBJECTIVE_OPTIONS)}")
    steps: int = setting(0, at_least=0, hint="optimiser steps; 0 = from epochs")
    epochs: float = setting(0.0, at_least=0)  # used when steps is 0
    batch_size: int = setting(128, at_least=1)  # global: across processes and accumulation steps
    micro_batch_size: int = setting(0, at_least=0)  # per process and forward pass; 0 = the whole per-process batch
    seed: int = setting(0, **SEED_RANGE)
    eval_every: int = setting(0, at_least=0)  # steps; 0 = only at the end
    log_every: int = setting(10, at_least=1)
    ckpt_every: int = setting(500, at_least=1)  # steps; a checkpoint is always written at the end
    keep_checkpoints: int = setting(3, at_least=1)
    ema: float = setting(0.0, at_least=0, below=1, hint="Polyak averaging factor, the paper's 0.9999; 0 = off")
    label_smoothing: float = setting(0.0, at_least=0, below=1)
    mixup: float = setting(0.0, at_least=0)  # Beta(alpha, alpha) of torchvision's MixUp; 0 = off
    cutmix: float = setting(0.0, at_least=0)
    precision: str = setting("fp32", one_of=PRECISIONS)  # bf16 / fp16 = autocast (fp16 with a loss scaler, GPUs)
    grad_checkpointing: bool = False
    compile: bool = False  # torch.compile the objective
    parallel: str = setting("ddp", one_of=PARALLEL)  # with torchrun: ddp or fsdp
    device: str = setting("auto", check=form_problem)  # auto = cuda when available, else cpu
    threads: int = setting(0, at_least=0, hint="torch CPU threads per process; 0 = one per core")
    eval_batch_size: int = setting(0, at_least=0)  # 0 = batch_size
    early_stop: EarlyStopConfig = dataclasses.field(default_factory=EarlyStopConfig)
    keep_best: str = ""  # SPLIT.NAME (dev.top1): write checkpoints/best.safetensors at each best evaluation
    # Signals that stop the run at the next step boundary with a checkpoint, to resume exactly
    # (a cluster's preemption or time limit; vitlab.train.preemption); [] = none.
    stop_signals: tuple[str, ...] = setting(("TERM", "USR1"), check=_signal_names)

    def __post_init__(self) -> None:
        check_fields(self, "train")


@dataclass(frozen=True)
class NoOptions:
    """The options of an objective that takes none (supervised: its regularisers are
    train.label_smoothing, train.mixup and train.cutmix)."""

    def to_dict(self) -> dict[str, Any]:
        return {}


# train.objective -> the dataclass of its `objective:` section. vitlab.train.objectives maps
# the same names to the objectives themselves.
OBJECTIVE_OPTIONS: dict[str, type] = {"supervised": NoOptions, "mpp": MPPConfig}

SECTIONS: dict[str, type] = {"data": DataConfig, "optim": OptimConfig, "train": TrainConfig}


@dataclass(frozen=True)
class RunConfig:
    """One training run: the model section, three plain sections, and the objective's options."""

    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    objective: Any = dataclasses.field(default_factory=NoOptions)  # OBJECTIVE_OPTIONS[train.objective]
    # "section.key" -> the layer that set it (config/provenance.py); a key not here is the
    # default. Not a setting: two configs of the same values are equal whoever set them.
    origins: Mapping[str, Origin] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_fields(self)  # each section is its dataclass (a dict is built into one), whoever builds the run
        want = OBJECTIVE_OPTIONS[self.train.objective]
        if not isinstance(self.objective, want):
            raise ConfigError(f"the objective section of train.objective={self.train.objective!r} must be a {want.__name__}, "
                              f"got {type(self.objective).__name__}")

    def origin(self, key: str) -> Origin:
        return self.origins.get(key, DEFAULT)

    def with_origins(self, origins: Mapping[str, Origin]) -> "RunConfig":
        """A new config of the same values, recording `origins` over those this one has."""
        wrong = [o for o in origins.values() if not isinstance(o, Origin)]
        if wrong:
            raise TypeError(f"origins are vitlab.config.provenance.Origin values, got {wrong[0]!r}")
        return dataclasses.replace(self, origins={**self.origins, **origins})

    def to_dict(self) -> dict[str, Any]:
        # (a hybrid's `model.resnet` change is a ResNetConfig: plain writes it as a mapping)
        return {"model": plain(self.model.to_dict()), **{name: plain(getattr(self, name)) for name in SECTIONS},
                "objective": plain(self.objective.to_dict())}

    @classmethod
    def from_dict(cls, d: Any, origin: Optional[Origin] = None) -> "RunConfig":
        """A run from plain values (a recipe, a config.yaml, overrides), numbers read from text;
        `origin`: the layer they come from, recorded for every key `d` holds. A run's
        config.yaml also holds the layers its run recorded (its `provenance` section): not a
        setting, so not read here; `RunFolder.read_config` reads it."""
        if not isinstance(d, dict):
            raise ConfigError(f"a recipe must be a mapping of sections, got {type(d).__name__}")
        valid = ("model", *SECTIONS, "objective", PROVENANCE)
        unknown = [k for k in d if k not in valid]
        if unknown:
            raise ConfigError(suggest.unknown("section", unknown[0], valid))
        every_unknown(d)
        sections = {k: section_from_text(c, d.get(k), k) for k, c in SECTIONS.items()}
        options = section_from_text(OBJECTIVE_OPTIONS[sections["train"].objective], d.get("objective"), "objective")
        cfg = cls(model=ModelSection.from_dict(d.get("model")), objective=options, **sections)
        return cfg.with_origins(dict.fromkeys(keys_of(d), origin)) if origin else cfg

    def with_overrides(self, overrides: dict[str, Any], origin: Origin = LIBRARY) -> "RunConfig":
        """Apply {"optim.lr": 0.01, "model.dropout": 0.1, ...}; a wrong key names the valid ones.
        `origin`: the layer that sets them (recorded; the other keys keep theirs)."""
        d = self.to_dict()
        objective_changed = "train.objective" in overrides and overrides["train.objective"] != self.train.objective
        if objective_changed:
            d["objective"] = {}  # the old objective's options belong to it
        for key, value in overrides.items():
            section, _, name = key.partition(".")
            _check_override_key(key, d)
            if section not in d or not name:
                raise ConfigError(f"bad override key {key!r}: write SECTION.KEY=VALUE with SECTION one of "
                                  f"{', '.join(d)} (e.g. optim.lr=0.001){suggest.hint(key, keys_of(d))}")
            head, _, rest = name.partition(".")
            if rest and isinstance(d[section].get(head), dict):  # a nested section: train.early_stop.patience
                d[section][head] = {**d[section][head], rest: value}
            else:
                d[section][name] = value
        kept = {k: v for k, v in self.origins.items() if not (objective_changed and k.startswith("objective."))}
        return RunConfig.from_dict(d).with_origins({**kept, **dict.fromkeys(overrides, origin)})


def _check_override_key(key: str, d: dict[str, Any]) -> None:
    """An override's key among every section's keys: a near one, of its section or another
    (`train.lrr` -> `optim.lr`), is named; the section's own check lists the rest."""
    section, _, name = key.partition(".")
    known = [k for k in keys_of(d)] + [f"model.{k}" for k in (*_VIT_FIELDS, *_MODEL_EXTRA, "head_start")]
    if key in known or (section in d and isinstance(d[section].get(name.partition(".")[0]), dict)):
        return
    near = suggest.close_key(key, known)
    if near:
        raise ConfigError(suggest.unknown("key", key, known, "a run's config.yaml shows every key", keys=True), reason="unknown-key")


def keys_of(d: Mapping[str, Any]) -> list[str]:
    """The "section.key" names a plain config mapping (a recipe, a config.yaml) sets."""
    return [f"{section}.{key}" for section, values in d.items() if isinstance(values, dict) and section != PROVENANCE
            for key in values]


def parse_override(text: str) -> tuple[str, Any]:
    """ "optim.lr=1e-3" -> ("optim.lr", "1e-3" read as YAML); the section's types convert it."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"bad override {text!r}: write SECTION.KEY=VALUE, e.g. optim.weight_decay=0.05")
    try:
        value = yaml.safe_load(raw)
    except (yaml.YAMLError, RecursionError):
        value = raw
    return key.strip(), value


def shipped_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def read_yaml(path_or_name: str, shipped: Path, what: str, names: list[str]) -> tuple[Any, Path]:
    """A YAML file by path, or by the name of one shipped under `shipped`; (its data, path)."""
    path = Path(path_or_name)
    if not on_disk(path, "file"):
        path = shipped / f"{path_or_name}.yaml"
        if not on_disk(path, "file"):
            listed = "`vitlab recipes` lists them" if what == "recipe" else f"shipped {what}s: {', '.join(names)}"
            raise ConfigError(suggest.unknown(what, path_or_name, names, f"{listed}; or pass a YAML file's path"))
    return read_yaml_file(path, dict, what, f"fix the {what}, or name a shipped one", ConfigError), path


def load_recipe(path_or_name: str) -> RunConfig:
    """A recipe file, or the name of one shipped in vitlab/configs ("digits", "cifar10", ...);
    its values recorded as set by "recipe NAME" (shipped) or "config file PATH" (any other)."""
    d, path = read_yaml(path_or_name, RECIPES, "recipe", shipped_recipes())
    shipped = path.resolve().parent == RECIPES and not on_disk(path_or_name, "file")
    try:
        return RunConfig.from_dict(d, recipe(path.stem) if shipped else config_file(path))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}", reason=e.reason) from None
