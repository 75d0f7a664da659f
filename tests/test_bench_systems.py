"""vitlab.bench.systems: what each system computes, at each precision and task."""

from __future__ import annotations

import pytest
import torch

from vitlab.api import get_config
from vitlab.bench.systems import Setting, System, prepare, standard_systems


def tiny(batch: int = 2, task: str = "infer", **overrides) -> Setting:
    return Setting(get_config("ViT-C/4", depth=1, image_size=16, **overrides), batch, task)


def test_labels_name_the_setting_and_the_system():
    assert tiny().label == "ViT-C/4 (custom: depth 1) 16px b2 infer"
    assert tiny(gelu="exact").label == "ViT-C/4 (custom: depth 1) gelu=exact 16px b2 infer"
    assert System("vitlab", "bf16", compiled=True).label == "vitlab bf16 compiled"


def test_standard_systems():
    infer = standard_systems("infer", ("timm",))  # the CPU's precisions by default
    assert [s.label for s in infer] == [
        "vitlab fp32", "vitlab fp32-packed", "vitlab fp32-auto", "vitlab bf16-autocast", "vitlab bf16", "vitlab int8",
        "timm fp32", "timm bf16-autocast", "timm bf16"]
    gpu = standard_systems("infer", ("timm",), precisions=("bf16", "fp16-autocast", "fp16"))
    assert [s.label for s in gpu] == ["vitlab bf16", "vitlab fp16-autocast", "vitlab fp16", "timm fp16-autocast",
                                      "timm bf16", "timm fp16"]
    train = standard_systems("train", ("timm",), compiled=("bf16-autocast",))
    assert [s.label for s in train] == ["vitlab fp32", "vitlab bf16-autocast", "timm fp32", "timm bf16-autocast",
                                        "vitlab bf16-autocast compiled"]


@pytest.mark.parametrize("precision", ["fp32", "fp32-packed", "fp32-auto", "bf16-autocast", "bf16", "fp16", "int8"])
def test_an_inference_call_returns_the_logits(precision):
    prepared = prepare(tiny(3), System("vitlab", precision), warmup=1)
    out = prepared.fn()
    assert out.shape == (3, 10) and out.is_floating_point() and torch.isfinite(out).all()
    assert prepared.compile_s != prepared.compile_s  # NaN: eager


def test_a_training_call_takes_a_step():
    prepared = prepare(tiny(4, "train"), System("vitlab", "bf16-autocast"), warmup=1)
    first = prepared.fn().item()
    for _ in range(5):
        last = prepared.fn().item()
    assert last < first  # the same batch, AdamW: the loss goes down


def test_a_checkpointed_training_step_is_the_same_step():
    plain = prepare(tiny(4, "train"), System("vitlab"), warmup=1)
    checkpointed = prepare(tiny(4, "train"), System("vitlab", checkpointing=True), warmup=1)
    assert System("vitlab", checkpointing=True).label == "vitlab fp32 checkpointed"
    # Same seed, same batch, same steps: recomputing the blocks changes no number.
    assert checkpointed.fn().item() == plain.fn().item()


def test_what_a_system_cannot_do_is_refused():
    with pytest.raises(ValueError, match="vitlab only"):
        prepare(tiny(), System("timm", "int8"))
    with pytest.raises(ValueError, match="training step runs in"):
        prepare(tiny(task="train"), System("vitlab", "int8"))
    with pytest.raises(ValueError, match="task 'serve'"):
        prepare(tiny(task="serve"), System("vitlab"))
