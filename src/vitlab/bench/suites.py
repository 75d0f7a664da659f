"""The named suites of `vitlab bench --suite NAME` and `benchmarks/run_all.py`."""

from __future__ import annotations

from vitlab.models.variants import variant_config
from vitlab.bench import SUITES
from vitlab.bench.systems import Setting, System, standard_systems

FAST = ["fp32", "fp32-packed", "bf16", "int8"]  # the inference precisions of the quick suite

Plan = list[tuple[Setting, list[System]]]


def setting(model: str, batch: int, task: str = "infer", **overrides) -> Setting:
    return Setting(variant_config(model, **overrides), batch, task)


def quick() -> Plan:
    """About 4 minutes on 2 quiet cores."""
    return [
        (setting("ViT-Ti/16", 1), standard_systems("infer", ("timm", "torchvision"), precisions=FAST)),
        (setting("ViT-B/16", 1), standard_systems("infer", ("timm",), precisions=FAST)),
        (setting("ViT-C/4", 128), standard_systems("infer", ("timm",), precisions=FAST)),
        (setting("ViT-C/4", 128, "train"), standard_systems("train", ("timm",))),
    ]


def full() -> Plan:
    """About 15 minutes on 2 quiet cores: every peer, batch 1 and a large batch per model."""
    plan = []
    for model, big in (("ViT-Ti/16", 16), ("ViT-S/16", 16), ("ViT-B/16", 8), ("ViT-C/4", 128)):
        plan.append((setting(model, 1), standard_systems("infer")))
        compiled = ("fp32",) if model == "ViT-C/4" else ()
        plan.append((setting(model, big), standard_systems("infer", compiled=compiled)))
    # torchvision's GELU is always the exact one: the same comparison with every library on it.
    plan.append((setting("ViT-Ti/16", 1, gelu="exact"), standard_systems("infer", precisions=("fp32", "fp32-packed"))))
    plan.append((setting("ViT-C/4", 128, "train"), standard_systems("train", compiled=("bf16-autocast",))))
    return plan


def suite(name: str) -> Plan:
    if name == "quick":
        return quick()
    if name == "full":
        return full()
    raise ValueError(f"unknown suite {name!r}; choose from {', '.join(SUITES)}")
