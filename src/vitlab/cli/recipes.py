"""Every recipe shipped in vitlab/configs (a name for `vitlab train --config` or `vitlab finetune
--config`), with the row of the paper's Table 3 (pretraining) or Table 2 (the ImageNet
fine-tune) it reproduces, its weight decay and how the optimiser applies it: AdamW's is
decoupled and multiplied by the scheduled learning rate, as the official code's Adam; Adam's
and SGD's are L2 added to the gradient. Matrices only, everywhere. A PATTERN (shell-style,
e.g. 'table3-jft-*') keeps the matching names; --json prints the list as JSON.
docs/reproducing.md says which command gives which cell of the paper's tables.

examples:
  vitlab recipes
  vitlab recipes 'table3-*'
  vitlab recipes table2-finetune-imagenet-512 --json
"""

from __future__ import annotations

import argparse

HELP = "list the shipped recipes with the paper's table row each reproduces and how it reads weight decay"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pattern", nargs="?", default="*", help="shell-style pattern of recipe names (default: all)")
    p.add_argument("--json", action="store_true", help="print name, source, weight decay and reading as JSON")


def run(args: argparse.Namespace) -> int:
    import fnmatch
    import json

    from vitlab.cli import UsageError
    from vitlab.config.recipes import list_recipes

    found = [r for r in list_recipes() if fnmatch.fnmatch(r.name, args.pattern)]
    if not found:
        raise UsageError(f"no shipped recipe matches {args.pattern!r}; `vitlab recipes` lists them all")
    if args.json:
        print(json.dumps([{"name": r.name, "source": r.source, "weight_decay": r.weight_decay,
                           "weight_decay_reading": r.reading} for r in found], indent=2))
        return 0
    width = max(len(r.name) for r in found)
    print(f"{'recipe':<{width}}  {'weight decay':<32}  source")
    for r in found:
        wd = "0" if r.reading == "none" else f"{r.weight_decay:g}, {r.reading}"
        print(f"{r.name:<{width}}  {wd:<32}  {r.source}")
    return 0
