"""Repeated fine-tuning: the same plan with several seeds, reported as mean ± std, as Table 2
reports "mean ± std over three fine-tuning runs".

Seed k trains into OUT/seed-k with train.seed = the plan's seed + k (the data order, the
augmentation and the random state of the new head's neighbours all change with it). When the
plan sweeps the learning rate, seed 0 runs the sweep and the best rate is reused by the
others: the rate is chosen once, the repeats measure the spread of fine-tuning itself. The
spread is the sample standard deviation (n - 1); OUT/repeats.json holds every run's numbers.
Each seed's folder resumes as any run does, so an interrupted --repeats picks up where it was.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Callable

from vitlab.config import ConfigError
from vitlab.config.provenance import REPEATS, SWEEP
from vitlab.files import atomic_write_text
from vitlab.spread import mean_std
from vitlab.train import distributed, finetune_choice as choice
from vitlab.train.finetune import Plan


def repeat(plan: Plan, repeats: int, run: Callable[[Plan], dict[str, Any]],
           log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run `plan` `repeats` times with seeds seed, seed+1, ...; `run(plan) -> result` is
    finetune.run with the caller's options. Returns (and writes to OUT/repeats.json) each
    seed's top-1 per evaluated split and their mean and std."""
    if repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {repeats}")
    seed, best_lr, best_recipe = plan.config.train.seed, None, None
    runs: list[dict[str, Any]] = []
    for k in range(repeats):
        cfg = plan.config.with_overrides({"train.seed": seed + k}, REPEATS)
        cfg = cfg.with_overrides({"optim.lr": best_lr}, SWEEP) if best_lr else cfg
        if best_recipe:  # the recipe the sweep chose (its optimiser and augmentation), at its rate
            # (the plan's own recipe, the paper's protocol, chooses the rate only: best_recipe "")
            cfg = choice.apply(cfg, choice.RECIPES[best_recipe], plan.explicit).with_overrides({"optim.lr": best_lr}, SWEEP)
        this = replace(plan, config=cfg, out=plan.out / f"seed-{k}", arms=[] if best_lr else plan.arms)
        result = run(this)
        best_lr = best_lr or result.get("best_lr")
        best_recipe = best_recipe or result.get("best_recipe")
        splits = {s: m["top1"] for s, m in result.get("final", result)["splits"].items()}
        runs.append({"seed": seed + k, "folder": str(this.out), "lr": cfg.optim.lr if best_lr is None else best_lr,
                     "top1": splits})
        log(f"repeat {k + 1}/{repeats} (seed {seed + k}): " + ", ".join(f"{s} top-1 {v:.2%}" for s, v in splits.items()))
    summary = {}
    for split in runs[0]["top1"]:
        mean, std = mean_std([r["top1"][split] for r in runs])
        summary[split] = {"mean": mean, "std": std or 0.0, "n": len(runs)}  # one run: no spread, printed ± 0
    out = {"repeats": repeats, "best_lr": best_lr, "best_recipe": best_recipe, "runs": runs, "top1": summary}
    if distributed.is_main_process():
        atomic_write_text(plan.out / "repeats.json", json.dumps(out, indent=2))
    return out


def report(result: dict[str, Any]) -> str:
    """'test top-1 81.20% ± 0.35 (3 runs)', one line per split, in Table 2's form."""
    return "\n".join(f"{split} top-1 {s['mean']:.2%} ± {100 * s['std']:.2f} ({s['n']} runs, mean ± std)"
                     for split, s in result["top1"].items())
