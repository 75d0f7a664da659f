"""Compute accounting (vitlab/compute.py): the FLOPs `vitlab models` prints, times that add up
across a pause and a resume, and one readable line."""

from __future__ import annotations

import json
import time

import pytest

import vitlab
from vitlab.api import model_table as rows
from vitlab.config import model_flops
from vitlab.train.compute import FIELDS, ComputeMeter, describe_device, format_compute, training_flops


@pytest.mark.parametrize("name", ["ViT-C/4", "BiT-R26-C", "R8+ViT-C/4"])
def test_forward_flops_are_the_models_table(name):
    table = {r["name"]: r["gflops"] for r in rows()}
    cfg = vitlab.get_config(name)
    meter = ComputeMeter(cfg)
    meter.step(1000)
    s = meter.summary()
    assert s["forward_gflops"] == pytest.approx(table[name], rel=1e-12)
    assert s["train_flops"] == pytest.approx(3 * 1000 * model_flops(cfg), rel=1e-12) == training_flops(cfg, 1000)
    assert list(s) == list(FIELDS)


def _busy(cpu_seconds: float) -> None:
    """Burn this much of the process's CPU time (not wall time: on a loaded machine a wall-clock
    loop may get little CPU)."""
    end = time.process_time() + cpu_seconds
    while time.process_time() < end:
        sum(range(1000))


def test_time_counts_only_while_running_and_survives_a_resume():
    cfg = vitlab.get_config("ViT-C/4")
    meter = ComputeMeter(cfg)
    # Bracket the counted span with the same clocks: it lies between what we saw inside and outside
    # the start and pause calls, whatever the machine's load.
    before_start, cpu_before = time.perf_counter(), time.process_time()
    meter.start()
    after_start = time.perf_counter()
    _busy(0.1)
    before_pause = time.perf_counter()
    meter.pause()
    after_pause, cpu_after = time.perf_counter(), time.process_time()
    time.sleep(0.2)  # paused: not counted
    first = meter.summary()
    ms = 0.001  # the summary rounds to milliseconds
    assert before_pause - after_start - ms <= first["wall_s"] <= after_pause - before_start + ms
    assert 0.1 - ms <= first["cpu_s"] <= cpu_after - cpu_before + ms
    assert first["gpu_s"] == 0 and first["device"].startswith("cpu")
    meter.step(64)
    resumed = ComputeMeter(cfg)
    resumed.load_state_dict(meter.state_dict())
    resumed.start()
    _busy(0.05)
    later = resumed.summary()
    assert later["images_seen"] == 64
    assert later["wall_s"] >= first["wall_s"] + 0.05 - ms and later["cpu_s"] >= first["cpu_s"] + 0.05 - ms


def test_one_line_for_the_final_print():
    meter = ComputeMeter(vitlab.get_config("BiT-R26-C"))
    meter.step(2_000_000)
    line = format_compute(meter.summary())
    assert line.startswith("compute  2.19 PFLOPs (0.365 GFLOPs/image x 3 x 2,000,000 images)")
    assert "CPU-s on cpu" in line and describe_device("cpu") in line


def test_a_run_records_its_compute_everywhere(tmp_path, capsys):
    from vitlab.cli import main

    out = tmp_path / "run"
    args = ["train", "--steps", "4", "--batch-size", "16", "--out", str(out), "model.hidden_size=32",
            "model.depth=1", "model.num_heads=2", "model.mlp_dim=32", "train.threads=1", "train.log_every=2"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())["compute"]
    cfg = vitlab.load(out / "checkpoints" / "last.safetensors").config
    assert summary["images_seen"] == 64 and summary["forward_gflops"] == pytest.approx(model_flops(cfg) / 1e9)
    assert summary["train_flops"] == pytest.approx(3 * 64 * model_flops(cfg))
    assert 0 < summary["wall_s"] and 0 < summary["cpu_s"] and summary["device"].startswith("cpu")
    assert format_compute(summary).split(",")[0] in printed
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in logged if r["split"] == "train"]
    assert [r["images_seen"] for r in train] == [32, 64]
    assert train[-1]["train_flops"] == summary["train_flops"] and train[0]["wall_s"] <= train[-1]["wall_s"]
