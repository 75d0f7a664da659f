"""vitlab.bench.runner: interleaved rounds, clean medians and within-round ratios."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vitlab.api import get_config
from vitlab.bench.ceiling import kernels
from vitlab.bench.runner import BenchConfig, Row, Sample, ratios, run
from vitlab.bench.systems import Setting, System, standard_systems

FAST = BenchConfig(rounds=1, min_time=0.0, min_calls=1, max_wait=0.0, wait_budget=0.0)


def tiny(batch: int = 2, task: str = "infer") -> Setting:
    return Setting(get_config("ViT-C/4", depth=1, image_size=16), batch, task)


def sample(rnd, rate, contended=False):
    return Sample(rnd, rate, 1.0 if contended else 0.0, contended)


@pytest.mark.slow
def test_every_precision_and_a_peer_are_timed_with_their_ceilings():
    pytest.importorskip("timm")
    systems = [System("vitlab", p) for p in ("fp32", "bf16-autocast", "bf16", "int8")]
    systems += [System("timm", "fp32")]
    rows = run([(tiny(), systems), (tiny(4, "train"), standard_systems("train", ()))],
               dataclasses.replace(FAST, rounds=2))
    timed = [r for r in rows if r.system.impl != "gemm"]
    assert len(timed) == 7 and not any(r.error for r in timed)
    for r in timed:
        assert len(r.samples) == 2 and r.median > 0 and r.ceiling > 0 and r.fraction > 0
        assert [s.round for s in r.samples] == [0, 1]
    gemm = {(r.setting.task, r.system.precision) for r in rows if r.system.impl == "gemm"}
    assert gemm == {("infer", "fp32"), ("infer", "bf16"), ("infer", "int8"), ("train", "fp32"), ("train", "bf16")}
    timm = next(r for r in timed if r.system.impl == "timm")
    assert timm.vs_timm == pytest.approx(1.0)
    # A row's fraction is its FLOPs x rate over its own dtype's ceiling.
    ours = next(r for r in timed if r.system == System("vitlab", "bf16"))
    # The ceiling is the fastest kernel's rate for the dtype.
    ceilings = [r for r in rows if r.system.impl == "gemm" and r.system.precision == "bf16" and r.setting.task == "infer"]
    assert {r.system.kernel for r in ceilings} == set(kernels("bf16"))
    assert ours.ceiling == max(r.median for r in ceilings)
    assert ours.fraction == pytest.approx(ours.flops_per_image * ours.median / ours.ceiling)


def test_a_peer_that_cannot_build_is_reported_not_fatal():
    cfg = get_config("ViT-C/4", depth=1, image_size=16, classifier="gap")
    rows = run([(Setting(cfg, 1), [System("vitlab"), System("hf")])], FAST)
    hf = next(r for r in rows if r.system.impl == "hf")
    assert "class token" in hf.error and not hf.samples and hf.ceiling is None
    assert next(r for r in rows if r.system.impl == "vitlab").samples


def test_ratios_are_taken_within_rounds_and_skip_contended_samples():
    s = tiny()
    ours = Row(s, System("vitlab"), [sample(0, 10), sample(1, 20), sample(2, 99, True)])
    timm = Row(s, System("timm"), [sample(0, 5), sample(1, 10), sample(2, 1)])
    hf = Row(s, System("hf"), [sample(0, 8), sample(1, 8), sample(2, 8)])
    ratios([ours, timm, hf])
    # Round 0: 10 / max(5, 8); round 1: 20 / max(10, 8); round 2 is contended.
    assert ours.vs_peer == pytest.approx((10 / 8 + 20 / 10) / 2)
    assert ours.vs_timm == pytest.approx(2.0)
    assert ours.median == 15  # contended sample dropped
    assert ours.n_clean == 2


def test_a_contended_reference_drops_the_round_and_all_contended_falls_back_to_all():
    s = tiny()
    ours = Row(s, System("vitlab"), [sample(0, 10), sample(1, 30)])
    timm = Row(s, System("timm"), [sample(0, 5, True), sample(1, 10)])
    ratios([ours, timm])
    assert ours.vs_timm == pytest.approx(3.0)  # round 0's reference was disturbed
    busy = Row(s, System("vitlab"), [sample(0, 4, True), sample(1, 8, True)])
    assert busy.median == 6 and busy.n_clean == 0


def test_peers_ratios_ignore_compiled_and_reduced_precision_peers():
    s = tiny()
    ours = Row(s, System("vitlab"), [sample(0, 10)])
    timm = Row(s, System("timm"), [sample(0, 5)])
    timm_bf16 = Row(s, System("timm", "bf16"), [sample(0, 50)])
    ratios([ours, timm, timm_bf16])
    assert ours.vs_peer == pytest.approx(2.0) and timm_bf16.vs_timm == pytest.approx(10.0)


def test_cpu_clock_runs_one_thread_and_restores_the_count():
    threads = torch.get_num_threads()
    seen = []
    config = dataclasses.replace(FAST, clock="cpu")
    rows = run([(tiny(), [System("vitlab")])], config, progress=lambda rows: seen.append(torch.get_num_threads()))
    assert seen == [1] and torch.get_num_threads() == threads
    assert all(r.median > 0 and not r.samples[0].contended for r in rows)
    with pytest.raises(ValueError, match="clock"):
        run([], dataclasses.replace(FAST, clock="sundial"))
