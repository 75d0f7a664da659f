"""The shipped recipes as a list: each with the table row of the paper it reproduces and how
its optimiser reads "weight decay" (`vitlab recipes`).

A recipe's header comment says where it comes from (`# Source: Table 3, row ...`); the
weight-decay reading follows from its optimiser, as vitlab.train.optim builds it:

- adamw: decoupled (Loshchilov & Hutter) and multiplied by the scheduled learning rate,
  torch.optim.AdamW's w <- w - lr_t * wd * w, the form of the official code's Adam;
- adam: L2, wd * w added to the gradient before Adam's normalisation;
- sgd: L2 added to the gradient, so scaled by the learning rate through the step.

Either way only matrices decay (not biases, norms, tokens or position embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vitlab.config.run import RECIPES, OptimConfig, load_recipe, shipped_recipes

READINGS = {"adamw": "decoupled, x lr (AdamW)", "adam": "L2 in the gradient (Adam)", "sgd": "L2 in the gradient (SGD)"}


@dataclass(frozen=True)
class RecipeInfo:
    name: str
    source: str  # the table row it reproduces, or what the recipe is for
    weight_decay: float
    reading: str  # how the optimiser applies weight_decay
    path: Path


def weight_decay_reading(optim: OptimConfig) -> str:
    """How this optimiser section's weight decay is applied; "none" when it is 0."""
    return "none" if optim.weight_decay == 0 else READINGS[optim.name]


def header(path: Path) -> dict[str, str]:
    """The `# Key: text` fields of a recipe's leading comment (continuation lines joined);
    "title" is its first line."""
    fields: dict[str, str] = {}
    key = None
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line[1:].strip()
        if not fields:
            fields["title"] = text
            continue
        head, sep, rest = text.partition(":")
        if sep and head and head[0].isupper() and len(head) < 16 and line[1:2] == " " and not line[2:3].isspace():
            key = head.strip().lower()
            fields[key] = rest.strip()
        elif key and line.startswith("#   "):
            fields[key] += " " + text
        else:
            key = None
    return fields


def list_recipes() -> list[RecipeInfo]:
    out = []
    for name in shipped_recipes():
        path = RECIPES / f"{name}.yaml"
        fields = header(path)
        optim = load_recipe(name).optim
        out.append(RecipeInfo(name, fields.get("source", fields.get("title", "")), optim.weight_decay,
                              weight_decay_reading(optim), path))
    return out
