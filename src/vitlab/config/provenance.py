"""Which layer set each value of a run's config: the layers as a closed set of types, and their
form in a run's config.yaml.

A value comes from one of these layers (`Layer`), roughly in the order they apply, a later one
over an earlier one:

    default                the dataclass's (config/run.py)
    recipe NAME            a shipped recipe (vitlab/configs/NAME.yaml)
    config file PATH       a recipe or config.yaml the user named (--config P, --resume RUN)
    checkpoint             read from the start checkpoint or the run that wrote it (vitlab
                           finetune: --paper-resolution's step up, the source run's threads)
    fine-tune plan         fitted to the checkpoint and the data by vitlab finetune (the batch,
                           the warm-up, Table 4's length)
    sweep                  chosen on the dev split (a recipe's changes, the rate), or a sweep arm's
    repeats                a repeat's own seed (vitlab finetune --repeats)
    vtab                   vitlab vtab's setting for every task
    data given as objects  the data section of a run given its datasets as objects (Trainer(data=...))
    vitlab                 a change whose caller named no layer (RunConfig.with_overrides(changes))
    command line           a flag or a SECTION.KEY=VALUE override

A run's config.yaml holds the layers twice. As data, in its `provenance` section: one entry
per origin, with the keys it set (a key in none is the default); that section is what
`from_document` reads back, with the values, in the one read of the file. As a view, a
comment after each value (`lr: 0.0003  # sweep`), for a reader: nothing reads the comments.
A config.yaml without the section (written before this one existed) reads as set by itself.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, cast

import yaml

from vitlab.config.fields import ConfigError
from vitlab.files.documents import DocumentError, check_shape

SECTION = "provenance"  # the key of the layers' data in a run's config.yaml


class Layer(enum.Enum):
    """The layers a value can come from, in the order above; the value is how files name it."""

    DEFAULT = "default"
    RECIPE = "recipe"
    CONFIG_FILE = "config file"
    CHECKPOINT = "checkpoint"
    PLAN = "fine-tune plan"
    SWEEP = "sweep"
    REPEATS = "repeats"
    VTAB = "vtab"
    DATA_OBJECTS = "data given as objects"
    LIBRARY = "vitlab"
    COMMAND_LINE = "command line"


NAMED = (Layer.RECIPE, Layer.CONFIG_FILE)  # the layers that say which: a recipe's name, a file's path


@dataclass(frozen=True)
class Origin:
    """Where a value came from: its layer and, for a recipe or a config file, which one."""

    layer: Layer
    source: str = ""  # the recipe's name or the file's path; empty for the other layers

    def __post_init__(self) -> None:
        if not isinstance(self.layer, Layer) or (self.layer in NAMED) != bool(self.source):
            raise ValueError(f"Origin({self.layer!r}, {self.source!r}): a recipe or config file names its source, "
                             "no other layer does")

    def __str__(self) -> str:
        return f"{self.layer.value} {self.source}" if self.source else self.layer.value


DEFAULT = Origin(Layer.DEFAULT)
CHECKPOINT = Origin(Layer.CHECKPOINT)
PLAN = Origin(Layer.PLAN)
SWEEP = Origin(Layer.SWEEP)
REPEATS = Origin(Layer.REPEATS)
VTAB = Origin(Layer.VTAB)
DATA_OBJECTS = Origin(Layer.DATA_OBJECTS)
LIBRARY = Origin(Layer.LIBRARY)
COMMAND_LINE = Origin(Layer.COMMAND_LINE)


def recipe(name: str) -> Origin:
    return Origin(Layer.RECIPE, name)


def config_file(path: Any) -> Origin:
    return Origin(Layer.CONFIG_FILE, str(path))


def origin_of(origins: Mapping[str, Origin], key: str) -> Origin:
    """The layer of `key`; for a mapping (train.early_stop) the latest of its own or its keys'."""
    own = [v for k, v in origins.items() if k == key or k.startswith(key + ".")]
    return own[-1] if own else DEFAULT


# config.yaml -----------------------------------------------------------------------------
def to_data(origins: Mapping[str, Origin]) -> list[dict[str, Any]]:
    """The `provenance` section: one entry per origin other than the default, in `Layer`'s
    order, with the keys it set, sorted (the same origins always write the same text)."""
    keys: dict[Origin, list[str]] = {}
    for key, origin in origins.items():
        if origin != DEFAULT:
            keys.setdefault(origin, []).append(key)
    order = list(Layer)
    entries = []
    for origin in sorted(keys, key=lambda o: (order.index(o.layer), o.source)):
        source = {"source": origin.source} if origin.source else {}
        entries.append({"layer": origin.layer.value, **source, "keys": sorted(keys[origin])})
    return entries


def from_document(d: Any) -> Optional[dict[str, Origin]]:
    """The layers a config.yaml's `provenance` section records ("section.key" -> Origin; a key
    in no entry is the default), or None for a file without one. A damaged section is a
    ConfigError naming what is wrong."""
    if not isinstance(d, dict) or SECTION not in d:
        return None
    fix = f"restore it, or delete the {SECTION} section (every value then counts as set by this file)"
    try:
        entries = cast(list, check_shape(d[SECTION], [{"layer": str, "source?": str, "keys": [str]}], SECTION))
    except DocumentError as e:
        raise ConfigError(f"{e}; {fix}") from None
    names = {layer.value: layer for layer in Layer}
    out: dict[str, Origin] = {}
    for i, entry in enumerate(entries):
        layer, source = names.get(entry["layer"]), entry.get("source", "")
        if layer is None:
            raise ConfigError(f"{SECTION}[{i}].layer={entry['layer']!r} is not a layer ({', '.join(names)}); {fix}")
        if (layer in NAMED) != bool(source):
            raise ConfigError(f"{SECTION}[{i}]: a {layer.value} entry {'needs' if layer in NAMED else 'takes no'} "
                              f"source; {fix}")
        out.update(dict.fromkeys(entry["keys"], Origin(layer, source)))
    return out


def _line(key: str, value: Any) -> str:
    """`key: value` on one line (flow style for lists and mappings)."""
    return yaml.safe_dump({key: value}, default_flow_style=True, sort_keys=False, width=math.inf).strip()[1:-1]


def annotated_yaml(d: Mapping[str, Any], origins: Mapping[str, Origin]) -> str:
    """A config (RunConfig.to_dict) as YAML, each value's line ending in `# LAYER` (the view),
    then the `provenance` section (the data)."""
    lines = []
    for section, values in d.items():
        if not values:
            lines.append(f"{section}: {{}}")
            continue
        lines.append(f"{section}:")
        for key, value in values.items():
            lines.append(f"  {_line(key, value)}  # {origin_of(origins, f'{section}.{key}')}")
        if section == "model":
            checkpoint = values.get("checkpoint")
            where = "the checkpoint's (model.checkpoint)" if checkpoint else f"the variant's ({values.get('name')})"
            lines.append(f"  # the network's other settings: {where}")
    lines.append("# Which layer set each value, as data (the comments above show the same); a key in no entry "
                 "is the default")
    lines.append(yaml.safe_dump({SECTION: to_data(origins)}, sort_keys=False, width=math.inf,
                                default_flow_style=None).rstrip())
    return "\n".join(lines) + "\n"
