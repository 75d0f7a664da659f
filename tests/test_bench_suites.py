"""vitlab.bench.suites: every suite builds, and the GPU suite's systems run (here, on the CPU)."""

from __future__ import annotations

import dataclasses

import pytest

from vitlab.bench import SUITES
from vitlab.bench.suites import suite
from vitlab.bench.systems import prepare
from vitlab.checkpoints.peers import variant_config


@pytest.mark.parametrize("name", SUITES)
def test_every_suite_builds(name):
    plan = suite(name)
    assert plan and all(systems for _, systems in plan)
    for setting, systems in plan:
        assert len(set(systems)) == len(systems), f"{setting.label}: a system twice"
    with pytest.raises(ValueError, match="unknown suite"):
        suite("huge")


def test_the_scaling_suite_covers_resolution_batch_and_checkpointing():
    plan = suite("scaling")
    tokens = sorted({s.config.num_tokens for s, _ in plan if s.config.name == "ViT-B/16" and s.batch == 1})
    assert tokens == [197, 577, 1025]
    assert {s.batch for s, _ in plan if s.task == "infer"} == {1, 2, 4, 8, 16}
    assert {sys.checkpointing for s, systems in plan if s.task == "train" for sys in systems} == {False, True}


def test_the_gpu_suites_systems_run_on_any_device():
    """The CUDA path shares every line but the device with this one: each eager system of the
    GPU suite runs a tiny model on the CPU (compiling is left to the GPU run)."""
    for setting, systems in suite("gpu"):
        tiny = dataclasses.replace(setting, config=variant_config("ViT-C/4", depth=1, image_size=16), batch=2)
        for system in systems:
            if not system.compiled:
                out = prepare(tiny, system, warmup=1, device="cpu").fn()
                assert out.isfinite().all(), system.label
