"""Where the time goes: CPU-time profiles (`benchmarks/op_profile.py`) of the settings the goals
name, one PyTorch thread, every operator timed by its own thread's CPU time.

One thread, because that is what a thread's CPU time can account for exactly; the shares
carry over to two threads closely for the large products and less so for small operators,
which parallelise worse (the wall-clock tables show the whole).
"""

from __future__ import annotations

from pathlib import Path

import torch

import op_profile as profile  # noqa: E402  (this folder's module: the script's folder is on sys.path)
import report_tables as tables  # noqa: E402  (this folder's module: the script's folder is on sys.path)
from vitlab.bench.suites import setting
from vitlab.bench.systems import System, prepare
from vitlab.files import atomic_write_text

INFERENCE = [("ViT-B/16", 1, "bf16"), ("ViT-B/16", 8, "bf16"), ("ViT-B/16", 8, "fp32"), ("ViT-B/16", 1, "int8"),
             ("ViT-B/16", 8, "int8"), ("ViT-C/4", 128, "bf16"), ("ViT-C/4", 128, "int8"), ("ViT-Ti/16", 1, "fp32")]
TRAINING = [("vitlab", "ViT-S/16", 32), ("timm", "ViT-S/16", 32), ("vitlab", "ViT-C/4", 128), ("timm", "ViT-C/4", 128)]
RESOLUTIONS = (224, 384, 512)
ATTENTION = ("attention products", "softmax", "fused attention")


def one_thread(fn):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(previous)


def profile_of(model: str, batch: int, task: str, system: System, **overrides) -> profile.Profile:
    prepared = prepare(setting(model, batch, task, **overrides), system, warmup=1)
    return profile.profile(prepared.fn, calls=2 if task == "train" else 3)


def attention_share(p: profile.Profile) -> float:
    return sum(p.shares().get(k, 0.0) for k in ATTENTION)


def profiles(out: Path, info: dict, log) -> dict[int, dict[str, float]]:
    """Write profiles.md; return attention's share of the time per resolution and precision."""
    inference = {}
    for model, batch, precision in INFERENCE:
        inference[f"{model} b{batch} {precision}"] = one_thread(
            lambda model=model, batch=batch, precision=precision: profile_of(model, batch, "infer", System("vitlab", precision)))
        log(f"profiled {model} b{batch} {precision}")
    training = {}
    for impl, model, batch in TRAINING:
        training[f"{impl} {model} b{batch}"] = one_thread(
            lambda impl=impl, model=model, batch=batch: profile_of(model, batch, "train", System(impl, "bf16-autocast")))
        log(f"profiled the {impl} {model} b{batch} training step")
    shares: dict[int, dict[str, float]] = {}
    for size in RESOLUTIONS:
        for precision in ("fp32", "bf16"):
            p = one_thread(lambda precision=precision, size=size: profile_of("ViT-B/16", 1, "infer", System("vitlab", precision),
                                                                          image_size=size))
            shares.setdefault(size, {})[precision] = attention_share(p)
        log(f"attention's share at {size} px: {shares[size]}")
    text = (f"# Where the time goes\n\n{tables.header(info)}\n\n{__doc__.split(chr(10) + chr(10))[1]}\n\n"
            "Each cell: CPU milliseconds per call and the share of the call. \"Python and dispatch "
            "overhead\" is the call's total minus its operators.\n\n## Inference (vitlab)\n\n"
            + profile.table(inference) + "\n## Training step, bf16 autocast (forward, backward, AdamW)\n\n"
            + profile.table(training) + "\n## Attention's share of ViT-B/16 at batch 1\n\n"
            + "| image | tokens | fp32 | bf16 |\n| --- | --- | --- | --- |\n"
            + "".join(f"| {s} px | {(s // 16) ** 2 + 1} | {shares[s]['fp32']:.0%} | {shares[s]['bf16']:.0%} |\n"
                      for s in RESOLUTIONS))
    atomic_write_text(out / "profiles.md", text)
    log(f"wrote {out / 'profiles.md'}")
    return shares
