"""The named suites of `vitlab bench --suite NAME` and `benchmarks/run_all.py`."""

from __future__ import annotations

from typing import Optional, Sequence

from vitlab.bench import SUITES
from vitlab.bench.systems import Setting, System, standard_systems
from vitlab.checkpoints.peers import variant_config
from vitlab.config import ConfigError

FAST = ["fp32", "fp32-packed", "fp32-auto", "bf16", "int8"]  # the inference precisions of the quick suite

Plan = list[tuple[Setting, list[System]]]


def setting(model: str, batch: int, task: str = "infer", **overrides) -> Setting:
    return Setting(variant_config(model, **overrides), batch, task)


def quick() -> Plan:
    """The settings the performance goals name, about 10 minutes on 2 quiet cores."""
    return [
        (setting("ViT-Ti/16", 1), standard_systems("infer", ("timm", "torchvision"), precisions=FAST)),
        (setting("ViT-B/16", 1), standard_systems("infer", ("timm",), precisions=FAST)),
        (setting("ViT-B/16", 8), standard_systems("infer", ("timm", "hf", "torchvision"), precisions=FAST)),
        (setting("ViT-C/4", 128), standard_systems("infer", ("timm",), precisions=FAST)),
        (setting("ViT-C/4", 128, "train"), standard_systems("train", ("timm",))),
        (setting("ViT-S/16", 32, "train"), standard_systems("train", ("timm",))),
    ]


def full() -> Plan:
    """About 15 minutes on 2 quiet cores: every peer, batch 1 and a large batch per model."""
    plan = []
    for model, big in (("ViT-Ti/16", 16), ("ViT-S/16", 16), ("ViT-B/16", 8), ("ViT-C/4", 128)):
        plan.append((setting(model, 1), standard_systems("infer")))
        compiled = ("fp32",) if model == "ViT-C/4" else ()
        plan.append((setting(model, big), standard_systems("infer", compiled=compiled)))
    # torchvision's GELU is always the exact one: the same comparison with every library on it.
    plan.append((setting("ViT-Ti/16", 1, gelu="exact"), standard_systems("infer", precisions=("fp32", "fp32-packed", "fp32-auto"))))
    plan.append((setting("ViT-C/4", 128, "train"), standard_systems("train", compiled=("bf16-autocast",))))
    return plan


def scaling() -> Plan:
    """How cost grows: ViT-B/16 with resolution (224, 384, 512 px: 197, 577, 1,025 tokens) and
    with batch size; the training step's memory with and without activation checkpointing."""
    infer = [System("vitlab", "fp32"), System("vitlab", "bf16"), System("timm", "fp32"), System("timm", "bf16")]
    plan = [(setting("ViT-B/16", 1, image_size=size), infer) for size in (224, 384, 512)]
    plan += [(setting("ViT-B/16", b), infer[:2] + infer[3:]) for b in (2, 4, 8, 16)]
    train = [System(impl, "bf16-autocast", checkpointing=c) for impl in ("vitlab", "timm") for c in (False, True)]
    plan += [(setting("ViT-S/16", 32, "train"), train), (setting("ViT-C/4", 128, "train"), train)]
    return plan


def gpu(model: str = "ViT-B/16", batches: Sequence[int] = (1, 256)) -> Plan:
    """On a CUDA device, a few minutes: `model` serving at each batch (fp32, bf16, fp16; bf16
    compiled with CUDA graphs) and its training step at the largest (bf16 autocast, eager and
    compiled), beside timm; the table gains MFU against the device's peak. The GPU goals
    (docs/performance.md) read ViT-B/16 at batch 256: the bf16 training step's MFU and its
    img/s against timm's, bf16 inference against timm's. timm's fp32 step is left out: at
    batch 256 its activations alone fill most of an 80 GB device."""
    serve = [System("vitlab", p) for p in ("fp32", "bf16", "fp16")]
    serve += [System("vitlab", "bf16", compiled=True, compile_mode="reduce-overhead")]
    serve += [System("timm", p) for p in ("fp32", "bf16-autocast", "bf16", "fp16")]
    train = [System("vitlab", "bf16-autocast"), System("vitlab", "bf16-autocast", compiled=True),
             System("timm", "bf16-autocast")]
    return [*((setting(model, b), serve) for b in batches), (setting(model, max(batches), "train"), train)]


def suite(name: str, models: Optional[Sequence[str]] = None, batches: Optional[Sequence[int]] = None) -> Plan:
    """A suite's plan. The GPU suite takes one model and its batch sizes (`vitlab bench --suite
    gpu --model M --batch-size B...`: a smoke test runs it tiny); the others fix theirs."""
    builders = {"quick": quick, "full": full, "scaling": scaling}
    if name != "gpu" and name not in builders:
        raise ValueError(f"unknown suite {name!r}; choose from {', '.join(SUITES)}")
    if name != "gpu" and (models or batches):
        raise ConfigError(f"--suite {name} fixes its models and batch sizes; drop --model and --batch-size, or --suite")
    if name != "gpu":
        return builders[name]()
    if len(models or []) > 1:
        raise ConfigError(f"--suite gpu times one model, not {len(models or [])}; give one --model")
    return gpu(variant_config(models[0]).name if models else "ViT-B/16", batches or (1, 256))
