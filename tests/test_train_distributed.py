"""Data parallel with torchrun on two CPU processes (gloo) matches one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

# Augmentation, dropout and Mixup off: then the only difference between the runs is who
# computes which half of each global batch, and the averaged gradient is the same.
ARGS = [
    "--steps", "8", "--batch-size", "32", "--ckpt-every", "4", "--seed", "11", "--quiet",
    "model.hidden_size=32", "model.depth=2", "model.num_heads=2", "model.mlp_dim=64", "model.image_size=8",
    "model.patch_size=4", "model.dropout=0", "data.crop_scale=[1.0,1.0]", "data.crop_ratio=[1.0,1.0]",
    "data.num_workers=0", "train.threads=1", "optim.warmup_steps=2", "optim.weight_decay=0.05",
]


def run(cmd: list[str], out) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([*cmd, "--out", str(out), *ARGS], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "vitlab", "train"]

# `vitlab train` that then fails (exit 99) if gloo's worker threads outlived the run: the process
# group must be gone before the interpreter exits, or a worker still letting go of a
# collective's tensors then aborts the process ("terminate called without an active exception").
GROUP_GONE = """import os, sys
from vitlab.cli import main
code = main(["train", *sys.argv[1:]])
tasks = "/proc/self/task"
names = [open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks)] if os.path.isdir(tasks) else []
left = [n for n in names if "gloo" in n]
print(f"gloo threads left at exit: {left}", file=sys.stderr)
sys.exit(99 if left else code)
"""


def same_weights(one, two) -> None:
    a = load_file(str(one / "checkpoints" / "last.safetensors"))
    b = load_file(str(two / "checkpoints" / "last.safetensors"))
    assert a.keys() == b.keys()
    # One exception, and it is mathematics, not the parallelism: the key bias of attention has
    # an exactly zero gradient (softmax ignores a constant added to every logit of a row), so
    # its computed gradient is rounding noise (~1e-10) that Adam divides by its own size into
    # full learning-rate steps. Everything else, which carries a real gradient, must agree.
    d = 32
    for k in a:
        if k.endswith("attn.qkv.bias"):
            a[k], b[k] = torch.cat([a[k][:d], a[k][2 * d :]]), torch.cat([b[k][:d], b[k][2 * d :]])
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-5, worst


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    run([sys.executable, "-m", "vitlab", "train"], tmp_path / "one")
    (tmp_path / "group_gone.py").write_text(GROUP_GONE)
    run([*TORCHRUN[:-3], str(tmp_path / "group_gone.py")], tmp_path / "two")
    same_weights(tmp_path / "one", tmp_path / "two")
    run([*TORCHRUN, "--fsdp"], tmp_path / "fsdp")  # sharded parameters, gathered checkpoints
    same_weights(tmp_path / "one", tmp_path / "fsdp")
    a = load_file(str(tmp_path / "one" / "checkpoints" / "last.safetensors"))
    early = load_file(str(tmp_path / "one" / "checkpoints" / "step-00000004.safetensors"))
    moved = max((a[k] - early[k]).abs().max().item() for k in a if k in early and a[k].shape == early[k].shape)
    assert moved > 1e-3  # the weights did train
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert s2["world_size"] == 2 and s1["splits"]["test"]["count"] == s2["splits"]["test"]["count"] == 360
    assert s1["splits"]["test"]["top1"] == pytest.approx(s2["splits"]["test"]["top1"], abs=1 / 360)
    # Only rank 0 wrote: one train line (the last step; log_every 20 > 8 steps) and one test line.
    lines = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["split"]) for r in lines] == [(8, "train"), (8, "test")]


@pytest.mark.slow
def test_a_probe_head_fine_tune_on_two_processes_matches_one(tmp_path):
    """model.head_start=probe: every process fits the same head before wrapping (DDP and FSDP),
    so two processes train what one does."""
    run([sys.executable, "-m", "vitlab", "train"], tmp_path / "source")
    source = tmp_path / "source" / "checkpoints" / "last.safetensors"
    tune = [f"model.checkpoint={source}", "model.head_start=probe"]
    run([sys.executable, "-m", "vitlab", "train", *tune], tmp_path / "one")
    run([*TORCHRUN, *tune], tmp_path / "two")
    run([*TORCHRUN, "--fsdp", *tune], tmp_path / "fsdp")
    summaries = [json.loads((tmp_path / n / "summary.json").read_text()) for n in ("one", "two", "fsdp")]
    probes = [{k: v for k, v in s["head_probe"].items() if k != "seconds"} for s in summaries]
    assert probes[0] == probes[1] == probes[2] and probes[0]["images"] == 1437
    assert [s["compute"]["forward_images"] for s in summaries] == [1437, 2 * 1437, 2 * 1437]  # each process's
    same_weights(tmp_path / "one", tmp_path / "two")
    same_weights(tmp_path / "one", tmp_path / "fsdp")
