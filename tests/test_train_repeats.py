"""`vitlab finetune --repeats N` (train/repeats.py): N seeds, each its own run, reported as
mean ± std as Table 2 does; the arithmetic checked against each run's own summary."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml

from vitlab.cli import main
from vitlab.spread import mean_std


def test_mean_std_is_the_sample_spread():
    assert mean_std([0.5]) == (0.5, None)  # one run has no spread (repeats.json writes 0)
    mean, std = mean_std([0.80, 0.82, 0.87])
    assert mean == pytest.approx(statistics.mean([0.80, 0.82, 0.87]))
    assert std == pytest.approx(statistics.stdev([0.80, 0.82, 0.87]))


def test_finetune_repeats_three_seeds(digits_run, tmp_path, capsys):
    ckpt = digits_run / "checkpoints" / "last.safetensors"
    out = tmp_path / "ft"
    argv = ["finetune", "--from", str(ckpt), "--data", "digits", "--steps", "4", "--lr", "0.01", "--batch-size", "64",
            "--repeats", "3", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "repeats.json").read_text())
    assert [r["seed"] for r in result["runs"]] == [0, 1, 2]
    tops = []
    for k in range(3):
        summary = json.loads((out / f"seed-{k}" / "summary.json").read_text())
        assert yaml.safe_load((out / f"seed-{k}" / "config.yaml").read_text())["train"]["seed"] == k
        tops.append(summary["splits"]["test"]["top1"])
    assert len(set(tops)) > 1  # the seeds differ, so do the runs
    mean, std = statistics.mean(tops), statistics.stdev(tops)
    assert result["top1"]["test"] == {"mean": pytest.approx(mean), "std": pytest.approx(std), "n": 3}
    assert f"test top-1 {mean:.2%} ± {100 * std:.2f} (3 runs, mean ± std)" in printed
    # A second call finds every run finished and reports the same numbers.
    assert main(argv) == 0
    assert json.loads((out / "repeats.json").read_text())["top1"] == result["top1"]
    assert main([*argv[:-5], "--repeats", "0", "--out", str(out)]) == 2
