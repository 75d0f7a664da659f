"""Which layer set each value of a run's config, written beside it in config.yaml.

A value comes from one of these layers, the later over the earlier:

    default          the dataclass's (config/run.py)
    recipe NAME      a shipped recipe (vitlab/configs/NAME.yaml)
    config file P    a recipe or config.yaml the user named (--config P, --resume RUN)
    checkpoint       read from the start checkpoint or the run that wrote it (vitlab finetune:
                     --paper-resolution's step up, the source run's threads and workers)
    fine-tune plan   fitted to the checkpoint and the data by vitlab finetune (the batch, the
                     warm-up, Table 4's length)
    sweep            chosen on the dev split (a recipe's changes, the rate), or a sweep arm's
    vtab             vitlab vtab's setting for every task
    command line     a flag or a SECTION.KEY=VALUE override

`annotated_yaml` writes the config as YAML with the layer as a comment on each line
(`lr: 0.0003  # sweep`); the file stays plain YAML, read as before (comments are ignored),
and `origins_in` reads the layers back, so that a resumed run keeps them.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from vitlab.config.run import DEFAULT_ORIGIN, RunConfig

LAYERS = ("default", "recipe NAME", "config file PATH", "checkpoint", "fine-tune plan", "sweep", "vtab",
          "command line")
COMMAND_LINE = "command line"
CHECKPOINT = "checkpoint"
PLAN = "fine-tune plan"
SWEEP = "sweep"
MARK = "  # "  # what separates a value from its layer on a line of config.yaml
_STARTS = ("default", "recipe ", "config file ", "checkpoint", "fine-tune plan", "sweep", "vtab", "command line",
           "data given", "vitlab", "repeats")


def _line(key: str, value: Any) -> str:
    """`key: value` on one line (flow style for lists and mappings)."""
    return yaml.safe_dump({key: value}, default_flow_style=True, sort_keys=False, width=math.inf).strip()[1:-1]


def origin_of(cfg: RunConfig, key: str) -> str:
    """The layer of `key`; for a mapping (train.early_stop) the latest of its own or its keys'."""
    own = [v for k, v in cfg.origins.items() if k == key or k.startswith(key + ".")]
    return own[-1] if own else DEFAULT_ORIGIN


def annotated_yaml(cfg: RunConfig) -> str:
    """The config as YAML, each value's line ending in `# LAYER`."""
    lines = []
    for section, values in cfg.to_dict().items():
        if not values:
            lines.append(f"{section}: {{}}")
            continue
        lines.append(f"{section}:")
        for key, value in values.items():
            lines.append(f"  {_line(key, value)}{MARK}{origin_of(cfg, f'{section}.{key}')}")
        if section == "model":
            where = "the checkpoint's (model.checkpoint)" if cfg.model.checkpoint else f"the variant's ({cfg.model.name})"
            lines.append(f"  # the network's other settings: {where}")
    return "\n".join(lines) + "\n"


def origins_in(text: str) -> dict[str, str]:
    """The layers an annotated config.yaml records ("section.key" -> layer); {} for one
    written before vitlab recorded them."""
    out, section = {}, ""
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            section = line.split(":", 1)[0].strip()
            continue
        body, mark, layer = line.rpartition(MARK)
        if not mark or not body.startswith("  ") or body.lstrip().startswith("#") or ":" not in body:
            continue
        layer = layer.strip()
        if section and layer.startswith(_STARTS):
            out[f"{section}.{body.strip().split(':', 1)[0]}"] = layer
    return out
