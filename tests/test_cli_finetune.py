"""`vitlab finetune` with only --from and --data does the right thing for a 16-px, a 32-px
and a 224-px checkpoint: its own resolution, a warm-up that ends, progress within seconds;
the plan line says what was chosen. And a short run does warm up, then decays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

import vitlab
from conftest import perturb
from vitlab.train.report import Progress

EVERY = dict(hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=5, head_init="xavier")


def checkpoint(tmp_path, size: int, patch: int, channels: int):
    torch.manual_seed(0)
    model = perturb(vitlab.create_model("ViT-Ti/4", image_size=size, patch_size=patch, in_channels=channels,
                                        mean=(0.5,) * channels, std=(0.5,) * channels, **EVERY))
    path = tmp_path / f"ck{size}.safetensors"
    vitlab.save(model, path)
    return path


def first_lines(cmd: list[str], until: str, timeout: float = 120.0) -> tuple[list[str], dict[str, float]]:
    """The command's output up to the first line starting with `until`, and when each kind
    of line arrived; the process is stopped there."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines, when = [], {}
    try:
        for line in proc.stdout:
            lines.append(line.rstrip())
            now = time.perf_counter() - start
            if line.startswith("training ") and "plan" not in when:
                when["plan"] = now
            if line.startswith(until):
                when["progress"] = now
                break
            assert now < timeout, "\n".join(lines)
    finally:
        proc.kill()
        proc.wait()
    return lines, when


@pytest.mark.parametrize("size,patch,channels", [(16, 4, 1), (32, 4, 3), (224, 16, 3)], ids=["16px", "32px", "224px"])
def test_only_from_and_data(tmp_path, size, patch, channels):
    ck = checkpoint(tmp_path, size, patch, channels)
    lines, when = first_lines([sys.executable, "-m", "vitlab", "finetune", "--from", str(ck), "--data", "digits",
                               "--out", str(tmp_path / "ft")], until="step 1/")
    text = "\n".join(lines)
    assert f"resolution {size}x{size}: the checkpoint's own" in text
    assert f"at {size}x{size} px" in text  # the run itself, not the recipe's 384
    # 500 steps (Table 4's small-data count), the recipe's batch in micro-batches the 1,293
    # images fill 4 times, the recipe chosen by a sweep of both recipes, 25 steps (5%) per
    # arm, on the threads the recipe sets.
    assert "batch 512: the recipe's, kept as the paper keeps it" in text
    assert "warm-up 5% of each run with the paper's recipe, 25% with AdamW" in text
    assert "a sweep between the paper's SGD and AdamW first, 6 runs of 25 steps" in text
    assert "sweep run: paper-lr-0.001, 25 steps" in text and "dev split 10%" in text
    assert "threads: one compute thread per core and 0 data workers, the recipe's" in text
    # A line at least every EVERY_S seconds: the step-1 heartbeat is due then; a loaded machine
    # delivers it a little late, so the bound is the promise plus slack, not the promise itself.
    assert "progress" in when and when["progress"] - when["plan"] < Progress.EVERY_S + 5, text


def test_a_short_run_warms_up_then_decays(tmp_path):
    ck = checkpoint(tmp_path, 16, 4, 1)
    out = tmp_path / "ft"
    r = subprocess.run([sys.executable, "-m", "vitlab", "finetune", "--from", str(ck), "--data", "digits",
                        "--steps", "40", "--lr", "0.01", "--out", str(out), "train.log_every=1", "train.threads=1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "warm-up 2 steps: 5% of the 40" in r.stdout and "quick sweep" not in r.stdout
    lrs = [json.loads(x)["lr"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert max(lrs) == pytest.approx(0.01, rel=1e-6) and lrs.index(max(lrs)) <= 2 and lrs[-1] < 1e-4
    assert vitlab.load(out / "checkpoints" / "last.safetensors").config.image_size == (16, 16)


def test_flowers_recipe_trains_at_global_batch_512(tmp_path):
    """Table 4's Flowers row (batch 512, 500 steps, warm-up 500 as vision_transformer runs it)
    on a training set of under 2,048 images: the batch stays 512, as micro-batches whose
    gradients add up to one step's (digits stand in for Flowers' 1,836 images minus dev)."""
    import yaml

    ck, out = checkpoint(tmp_path, 16, 4, 1), tmp_path / "flowers"
    r = subprocess.run([sys.executable, "-m", "vitlab", "finetune", "--from", str(ck), "--data", "digits",
                        "--table4", "flowers", "--recipe", "paper", "--lr", "0.01", "--out", str(out),
                        "train.steps=2", "train.log_every=1", "train.threads=1"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "batch 512: the recipe's, kept as the paper keeps it" in r.stdout
    train = yaml.safe_load((out / "config.yaml").read_text())["train"]
    assert (train["batch_size"], train["micro_batch_size"]) == (512, 256)
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert [m["step"] for m in steps][-1] == 2


def test_paper_resolution_and_conflicting_flags(tmp_path, capsys):
    from vitlab.cli import main

    ck = checkpoint(tmp_path, 16, 4, 1)
    assert main(["finetune", "--from", str(ck), "--data", "digits", "--paper-resolution", "--image-size", "32"]) == 2
    assert "give one" in capsys.readouterr().err
    assert main(["finetune", "--from", str(ck), "--data", "digits", "--lr-grid", "0.1,x"]) == 2


def test_the_default_chooses_a_recipe_on_dev_and_counts_the_sweep(tmp_path, digits_run):
    """From a real vitlab run: the source run's threads, six arms of both recipes scored on the
    dev split, the winner trained in full, and the sweep's images in the final summary."""
    import yaml

    out = tmp_path / "ft"
    r = subprocess.run([sys.executable, "-m", "vitlab", "finetune", str(digits_run / "checkpoints" / "last.safetensors"),
                        "--data", "digits", "--steps", "20", "--batch-size", "64", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"threads: 1 compute thread and 0 data workers, as the source run trained ({digits_run}" in r.stdout
    sweep = json.loads((out / "sweep.json").read_text())
    assert [a["arm"] for a in sweep["arms"]] == ["paper-lr-0.001", "paper-lr-0.003", "paper-lr-0.01", "paper-lr-0.03",
                                                 "adamw-lr-0.0003", "adamw-lr-0.001"]
    assert f"recipe: {sweep['best_recipe']} (lr {sweep['best_lr']:g}) scored" in r.stdout
    assert "noise (2 standard errors)" in r.stdout and "sweep done: " in r.stdout and "with the sweep: compute" in r.stdout
    assert "is not shorter than the run" not in r.stderr  # an arm warms up as the run it is the start of, by design
    arms = [json.loads((out / "sweep" / a["arm"] / "summary.json").read_text()) for a in sweep["arms"]]
    assert {a["steps"] for a in arms} == {10} and all(a["splits"]["dev"]["count"] == 144 for a in arms)
    best = max(sweep["arms"], key=lambda a: a["dev_top1"])
    assert sweep["dev_top1"] == best["dev_top1"]
    final = json.loads((out / "final" / "summary.json").read_text())
    assert final["steps"] == 20 and final["steps_with_sweep"] == 80
    assert final["compute_with_sweep"]["images_seen"] == 80 * 64 == final["compute"]["images_seen"] + sum(
        a["compute"]["images_seen"] for a in arms)
    config = yaml.safe_load((out / "final" / "config.yaml").read_text())
    assert config["optim"]["name"] == {"paper": "sgd", "adamw": "adamw"}[sweep["best_recipe"]]
    assert config["optim"]["lr"] == sweep["best_lr"] and config["train"]["threads"] == 1


def test_quiet_prints_the_summary_only_and_from_is_an_alias(tmp_path, digits_run):
    """--quiet: the final run's summary and the sweep's pick, nothing of the six sweep runs;
    the checkpoint given as --from CHECKPOINT (the earlier form) is the same command."""
    out = tmp_path / "ft"
    r = subprocess.run([sys.executable, "-m", "vitlab", "finetune", "--data", "digits", "--steps", "20", "train.log_every=5",
                        "--from", str(digits_run / "checkpoints" / "last.safetensors"), "--batch-size", "64",
                        "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("done: 20 steps") and lines[-2].startswith("sweep done: ") and len(lines) <= 19, lines
    assert lines[lines.index("next:") + 1].startswith("  vitlab eval ") and "/final/checkpoints/" in lines[lines.index("next:") + 1]
    assert not any(line.startswith(("sweep: ", "  sweep run:", "fine-tuning defaults")) or "/sweep/" in line for line in lines)
    assert json.loads((out / "final" / "summary.json").read_text())["steps_with_sweep"] == 80
    assert "  log_every: 5  # command line" in (out / "final" / "config.yaml").read_text()  # the override, put back
