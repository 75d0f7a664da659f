"""The benchmark machinery (vitlab.deploy.bench, `vitlab bench`) runs; no figure is tested."""

from __future__ import annotations

import csv

import pytest

from vitlab.api import get_config
from vitlab.cli import main
from vitlab.deploy import bench

FAST = bench.BenchConfig(rounds=1, min_time=0.0, min_calls=1, max_wait=0.0, wait_budget=0.0)


def tiny(batch: int = 2, task: str = "infer") -> bench.Setting:
    return bench.Setting(get_config("ViT-C/4", depth=1, image_size=16), batch, task)


@pytest.mark.slow
def test_bench_runs_every_precision_and_a_peer(tmp_path):
    pytest.importorskip("timm")
    systems = [bench.System("vitlab", p) for p in ("fp32", "bf16-autocast", "bf16", "int8")]
    systems += [bench.System("timm", "fp32")]
    rows = bench.run([(tiny(), systems), (tiny(4, "train"), bench.standard_systems("train", ()))], FAST)
    timed = [r for r in rows if r.system.impl != "gemm"]
    assert len(timed) == 7 and not any(r.error for r in timed)
    for r in timed:
        assert len(r.samples) == 1 and r.median > 0 and r.ceiling > 0 and r.fraction > 0
    gemm = {(r.setting.task, r.system.precision) for r in rows if r.system.impl == "gemm"}
    assert gemm == {("infer", "fp32"), ("infer", "bf16"), ("infer", "int8"), ("train", "fp32"), ("train", "bf16")}
    timm = next(r for r in timed if r.system.impl == "timm")
    assert timm.vs_timm == pytest.approx(1.0)
    csv_path, md_path = bench.write_results(rows, tmp_path, "t", bench.machine_info(), FAST)
    with open(csv_path) as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and set(table[0]) == set(bench.COLUMNS)
    assert "vitlab int8" in md_path.read_text()


def test_a_peer_that_cannot_build_is_reported_not_fatal():
    cfg = get_config("ViT-C/4", depth=1, image_size=16, classifier="gap")
    rows = bench.run([(bench.Setting(cfg, 1), [bench.System("vitlab"), bench.System("hf")])], FAST)
    hf = next(r for r in rows if r.system.impl == "hf")
    assert "class token" in hf.error and not hf.samples
    assert next(r for r in rows if r.system.impl == "vitlab").samples


def sample(rnd, rate, contended=False):
    return bench.Sample(rnd, rate, 1.0 if contended else 0.0, contended)


def test_ratios_are_taken_within_rounds_and_skip_contended_samples():
    s = tiny()
    ours = bench.Row(s, bench.System("vitlab"), [sample(0, 10), sample(1, 20), sample(2, 99, True)])
    timm = bench.Row(s, bench.System("timm"), [sample(0, 5), sample(1, 10), sample(2, 1)])
    hf = bench.Row(s, bench.System("hf"), [sample(0, 8), sample(1, 8), sample(2, 8)])
    bench._ratios([ours, timm, hf])
    # Round 0: 10 / max(5, 8); round 1: 20 / max(10, 8); round 2 is contended.
    assert ours.vs_peer == pytest.approx((10 / 8 + 20 / 10) / 2)
    assert ours.vs_timm == pytest.approx(2.0)
    assert ours.median == 15  # contended sample dropped
    assert ours.n_clean == 2


def test_cpu_meter_sees_our_own_work_as_ours():
    with bench.CpuMeter() as m:
        sum(i * i for i in range(300_000))
    assert m.wall > 0 and m.others >= 0.0
    assert set(bench.machine_info()) >= {"cpu", "cores", "torch", "timm"}


def test_bench_cli(tmp_path, capsys):
    args = ["bench", "--model", "ViT-C/4", "--batch-size", "2", "--rounds", "1", "--min-time", "0",
            "--wait-budget", "0", "--precision", "fp32", "int8", "--peers", "--out", str(tmp_path), "--name", "x"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "vitlab int8" in out and "matmul ceiling int8" in out
    assert (tmp_path / "x.csv").exists() and (tmp_path / "x.md").exists()
    assert main(["bench", "--peers", "jax"]) == 2
    assert "unknown peer" in capsys.readouterr().err
    assert main(["bench", "--model", "ViT-Q/9"]) == 2


def test_cpu_clock_runs_one_thread_and_restores_the_count():
    import dataclasses

    import torch

    threads = torch.get_num_threads()
    seen = []
    config = dataclasses.replace(FAST, clock="cpu")
    rows = bench.run([(tiny(), [bench.System("vitlab")])], config, progress=lambda rows: seen.append(torch.get_num_threads()))
    assert seen == [1] and torch.get_num_threads() == threads
    assert all(r.median > 0 and not r.samples[0].contended for r in rows)
    assert "CPU-time clock" in bench.markdown(rows, None, config)
    with pytest.raises(ValueError, match="clock"):
        bench.run([], dataclasses.replace(FAST, clock="sundial"))
