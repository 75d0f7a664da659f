"""vitlab.bench.machine: other processes' CPU use, peak memory, what the machine is."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from vitlab.bench import machine


def test_others_use_is_busy_time_minus_ours_per_wall_second():
    assert machine.others_cores(busy_s=3.0, own_s=1.0, wall_s=2.0) == pytest.approx(1.0)
    assert machine.others_cores(busy_s=0.99, own_s=1.0, wall_s=1.0) == 0.0  # clock grain, not negative use


def test_a_busy_child_process_counts_as_another_process():
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # let it start spinning
        with machine.CpuMeter() as m:
            time.sleep(1.0)
    finally:
        child.kill()
        child.wait()
    # The child spins one core for the whole second; whatever else runs only adds to that.
    assert m.wall >= 1.0
    assert m.others >= 0.5


def test_wait_quiet_gives_up_after_its_budget():
    t0 = time.perf_counter()
    machine.wait_quiet(threshold_cores=-1.0, max_wait=0.3, window=0.1)  # never quiet enough
    assert 0.3 <= time.perf_counter() - t0 < 2.0
    waiter = machine.Waiter(-1.0, max_wait=0.2, budget=0.3)
    waiter()
    waiter()
    assert waiter.left <= 0
    t0 = time.perf_counter()
    waiter()  # the budget is spent: no more waiting
    assert time.perf_counter() - t0 < 0.05


def test_peak_memory_added_by_a_call():
    rss = machine.reset_peak_rss()
    if rss <= 0:
        pytest.skip("this kernel does not allow resetting the peak-RSS mark")
    x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    assert machine.peak_added_mib(rss) >= 50
    del x
    assert machine.peak_added_mib(-1) != machine.peak_added_mib(-1)  # NaN: no reading


def test_machine_info_names_the_machine_and_versions():
    info = machine.machine_info()
    assert set(info) >= {"date", "cpu", "cores", "threads", "isa", "device", "torch", "timm"}
    assert info["torch"] == torch.__version__ and info["device"] == "cpu"
    assert int(info["cores"]) >= 1 and info["cpu"]


def test_device_peaks_for_mfu():
    assert machine.device_peak_flops("cuda", "bf16", name="NVIDIA H200") == pytest.approx(989.4e12)
    assert machine.device_peak_flops("cuda", "fp32", name="NVIDIA H100 PCIe") == pytest.approx(51.2e12)
    assert machine.device_peak_flops("cuda", "bf16", name="Tesla V100-SXM2-16GB") is None  # no bf16 units
    assert machine.device_peak_flops("cuda", "bf16", name="Some Future GPU") is None
    assert machine.device_peak_flops("cpu", "bf16") is None  # a CPU's ceiling is measured instead
