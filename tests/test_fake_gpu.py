"""vitlab's CUDA branches, run on a CPU that plays a machine of one or two GPUs
(tests/fake_gpu.py; tests/README.md says what it fakes and what stays real): the device choice,
serving's model load, the nvjpeg decode and its fallback, the benchmark's clock, a two-process
torchrun meeting over NCCL, and benchmarks/gpu.sh running every user command (train in bf16
and fp16, resume, finetune, eval, predict, export, torchrun, bench, the data path).
tools/cuda_coverage.py reads the coverage these tests record (VITLAB_CUDA_COVERAGE) and fails
on a CUDA line of src/vitlab that none of them ran."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

import fake_gpu
from conftest import ROOT, cifar_test_images, small_classifier
from vitlab.bench import machine
from vitlab.cli import main
from vitlab.config import ConfigError, DataConfig, pick_device
from vitlab.data import decode as D
from vitlab.data.datasets import Encoded
from vitlab.data.transforms import train_transform
from vitlab.serve.engine import Engine
from vitlab.train import distributed, state
from vitlab.train.compute import describe_device

pytestmark = pytest.mark.fake_gpu

TINY = ["--quiet", "model.hidden_size=32", "model.depth=2", "model.num_heads=2", "model.mlp_dim=64", "model.image_size=8",
        "model.patch_size=4", "data.num_workers=0", "train.threads=1", "optim.warmup_steps=1"]


def test_the_fake_plays_the_gpus_for_real_computation_and_leaves_no_trace():
    real = torch.cuda.is_available()
    with fake_gpu.installed(2) as gpu:
        assert torch.cuda.is_available() and torch.cuda.device_count() == 2
        x = torch.arange(4.0)
        y = x.to(torch.device("cuda", 1), non_blocking=True)
        assert y is not x and torch.equal(y, x)  # a move to a device is a copy
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            x.to("cuda:2")
        with torch.autocast("cuda", dtype=torch.bfloat16):  # reduced precision computes for real
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
        assert gpu.counts["to cuda non_blocking"] == 1 and gpu.seen["autocast"] == {"bfloat16"}
    assert torch.cuda.is_available() == real and "to" not in torch.Tensor.__dict__


def test_a_gpu_is_picked_named_and_refused_past_the_last(monkeypatch):
    with fake_gpu.installed(2) as gpu:
        assert pick_device("auto") == torch.device("cuda")
        assert pick_device("cuda:1") == torch.device("cuda", 1)
        with pytest.raises(ConfigError, match=r"cuda:2: .* 2 GPU\(s\), cuda:0 to cuda:1"):
            pick_device("cuda:2", "train.device=")
        assert describe_device(torch.device("cuda", 1), 2) == f"cuda: 2 x {fake_gpu.NAME}"
        # One process per GPU: torchrun's local rank picks it (here a world of one process, so no group forms).
        monkeypatch.setenv("WORLD_SIZE", "1")
        monkeypatch.setenv("LOCAL_RANK", "1")
        assert distributed.setup("cuda").device == torch.device("cuda", 1)
        assert gpu.seen["set_device"] == {"cuda:1"}
        monkeypatch.setenv("LOCAL_RANK", "2")  # three processes on a node of two GPUs
        with pytest.raises(ConfigError, match=r"process 2 .* --nproc_per_node 2"):
            distributed.setup("cuda")
    with fake_gpu.installed(1):  # srun --gpus-per-task: each task sees its own GPU as cuda:0
        assert distributed.setup("cuda").device == torch.device("cuda", 0)


def test_a_checkpoint_keeps_the_generator_of_its_own_gpu_and_resumes_where_fewer_are_visible():
    """A process saves the generator of the GPU it trains on, not of every GPU it can see:
    restoring eight states where one GPU is visible (srun --gpus-per-task) is an error."""
    with fake_gpu.installed(2):
        torch.cuda.manual_seed_all(3)
        torch.cuda.set_rng_state(fake_gpu.FakeGpu._rng_state(7), "cuda:1")
        tensors, meta = state.capture_rng(torch.device("cuda", 1))
        assert torch.equal(tensors["cuda"], fake_gpu.FakeGpu._rng_state(7))
        assert [k for k in tensors if k.startswith("cuda")] == ["cuda"]
    with fake_gpu.installed(1) as gpu:
        state.restore_rng(tensors, meta, torch.device("cuda", 0))
        assert torch.equal(torch.cuda.get_rng_state(0), fake_gpu.FakeGpu._rng_state(7))
        assert gpu.seen["set_rng_state"] == {"cuda:0"}


def test_data_decode_cuda_refuses_what_it_cannot_do_in_one_line():
    from vitlab.config import RunConfig
    from vitlab.train.build import train_loader

    with fake_gpu.installed(1):
        with pytest.raises(ConfigError, match="use data.decode=fast with randaugment"):
            DataConfig(decode="cuda", randaugment=2)
        with pytest.raises(ValueError, match="run on the CPU: use decode=fast"):
            train_transform(32, decode="cuda", randaugment=2)
        cfg = RunConfig().with_overrides({"data.decode": "cuda"})
        with pytest.raises(ConfigError, match="this run is on cpu; use data.decode=fast"):
            train_loader(cfg, [], 1, 0, 1, distributed.Context())


@pytest.fixture
def jpegs(cifar_dir, tmp_path) -> list[Path]:
    out = []
    for name, data, _ in cifar_test_images(cifar_dir, 6):
        out.append(tmp_path / name)
        out[-1].write_bytes(data)
    return out


def planned(files: list[Path]) -> list[D.Planned]:
    plan = train_transform(32, decode="cuda")
    torch.manual_seed(0)
    return [plan(Encoded(f, str(f))) for f in files]


def test_nvjpeg_decodes_the_batch_and_one_jpeg_it_refuses_sends_the_batch_to_the_cpu(jpegs, tmp_path):
    items = planned(jpegs)
    assert all(p.encoded for p in items)
    on_cpu = D.decode_planned(items, (32, 32), "cpu")
    with fake_gpu.installed(1) as gpu:
        on_gpu = D.decode_planned(items, (32, 32), "cuda")
    assert gpu.seen["decode_jpeg cuda"] == {"decoded"} and torch.equal(on_gpu, on_cpu)
    jpegtran = shutil.which("jpegtran")
    if jpegtran is None:
        pytest.skip("needs jpegtran (Debian's libjpeg-turbo-progs) for an arithmetic-coded JPEG")
    arithmetic = tmp_path / "arithmetic.jpg"
    arithmetic.write_bytes(subprocess.run([jpegtran, "-arithmetic"], input=jpegs[0].read_bytes(), capture_output=True,
                                          check=True).stdout)
    items = planned([*jpegs, arithmetic])
    with fake_gpu.installed(1) as gpu:
        on_gpu = D.decode_planned(items, (32, 32), "cuda")
    assert gpu.seen["decode_jpeg cuda"] == {"refused"}  # nvjpeg takes no arithmetic coding: all on the CPU
    assert torch.equal(on_gpu, D.decode_planned(items, (32, 32), "cpu"))


def test_serve_loads_the_model_onto_the_gpu_and_refuses_a_cpu_copy_there(classifier_checkpoint, monkeypatch, capsys):
    from vitlab.serve import server

    engines: list[Engine] = []
    monkeypatch.setattr(server, "start", lambda engine, config, access_log=False: engines.append(engine) or 0)
    x = [torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    with fake_gpu.installed(1) as gpu:
        assert main(["serve", str(classifier_checkpoint), "--device", "cuda", "--precision", "bf16"]) == 0
        probs = engines[0].classify(x)
        looked = engines[0].look(x[:1])
        assert main(["serve", str(classifier_checkpoint), "--device", "cuda", "--precision", "int8"]) == 2
    assert "on cuda use fp32, bf16 or fp16" in capsys.readouterr().err
    assert engines[0].device == torch.device("cuda") and gpu.seen["autocast"] == {"bfloat16"}
    reference = Engine(small_classifier(), "fp32").classify(x)
    assert np.allclose(np.stack(probs), np.stack(reference), atol=0.02)  # bf16's rounding
    # look's exact attention (it returns the weights) against classify's fused kernel, both in bf16
    assert np.allclose(looked[0].probs, probs[0], atol=0.02) and looked[0].probs.argmax() == probs[0].argmax()


def test_the_benchmark_reads_the_gpu_it_times():
    with fake_gpu.installed(2) as gpu:
        assert machine.check_device("cuda:1") == "cuda:1"
        machine.device_sync("cuda:1")()
        assert machine.peak_memory_added_mib("cuda:1", machine.reset_peak_memory("cuda:1")) == 0  # the fake keeps no figure
        assert machine.device_peak_flops("cuda:1", "bf16") == 989.4e12
        assert machine.device_peak_flops("cuda:1", "bf16", name="NVIDIA GeForce GTX 1080") is None  # no peak known: no MFU
        info = machine.machine_info("cuda:1")
    assert gpu.seen["synchronize"] == {"cuda:1"}  # the device timed, not the current one (cuda:0)
    assert info["device"] == fake_gpu.NAME and info["isa"].startswith("CUDA ")


def records_of(log: Path, *words: str) -> list[dict]:
    """The fake GPU's records of the processes whose command line has each of `words` as an argument."""
    return [r for r in fake_gpu.read_log(log) if all(w in r["argv"] for w in words)]


@pytest.mark.slow
def test_two_processes_each_take_their_gpu_and_meet_over_nccl(tmp_path):
    log, out = tmp_path / "gpus.jsonl", tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "vitlab",
               "train", "--device", "cuda", "--bf16", "--steps", "4", "--batch-size", "32", "--ckpt-every", "4",
               "--out", str(out), *TINY]
    r = subprocess.run(command, capture_output=True, text=True, timeout=600, env=fake_gpu.child_env(2, log))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    workers = sorted((w for w in records_of(log, "train") if w["rank"] is not None), key=lambda w: w["rank"])
    assert [w["rank"] for w in workers] == ["0", "1"]
    for rank, w in enumerate(workers):
        assert w["seen"]["set_device"] == [f"cuda:{rank}"]
        assert w["seen"]["init_process_group"] == [f"nccl device_id=cuda:{rank}"]
        assert w["seen"]["DistributedDataParallel"] == [f"device_ids=[{rank}]"]
        assert w["seen"]["autocast"] == ["bfloat16"] and w["counts"]["pin_memory"] > 0
        assert w["seen"]["get_rng_state"] == [f"cuda:{rank}"]  # each saves the generator of its own GPU
    with safe_open(str(out / "checkpoints" / "step-00000004.state.safetensors"), framework="pt") as f:
        assert {k for k in f.keys() if "cuda" in k} == {"rng.rank0.cuda", "rng.rank1.cuda"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["splits"]["test"]["count"] == 360
    assert summary["compute"]["device"] == f"cuda: 2 x {fake_gpu.NAME}"


@pytest.mark.slow
def test_gpu_sh_runs_every_user_command_through_its_cuda_branches(tmp_path, cifar_dir):
    """benchmarks/gpu.sh --smoke: the script a GPU machine runs, at tiny sizes, with a CPU
    playing the GPU. Every command must succeed and take its CUDA arms; both pages are written."""
    log, out, work = tmp_path / "gpus.jsonl", tmp_path / "results", tmp_path / "work"
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--smoke", "--out", str(out), "--work", str(work),
                        "--data", str(cifar_dir)], capture_output=True, text=True, timeout=1200, env=fake_gpu.child_env(1, log))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert_every_command_took_its_cuda_arms(log, out, work)


def assert_every_command_took_its_cuda_arms(log: Path, out: Path, work: Path) -> None:
    commands = (out / "gpu-commands.md").read_text()
    assert "12 of 12 steps succeeded" in commands and "A smoke run" in commands
    goals = (out / "gpu-goals.md").read_text()
    for goal in ("training step, batch 2: MFU", "training step, batch 2: img/s against timm's",
                 "inference, batch 2: img/s against timm's", "the nvjpeg data path"):
        assert goal in goals
    assert "## Where the time goes: the bf16 training step" in goals  # the played GPU's MFU is short
    assert (out / "gpu.md").exists() and (out / "pipeline-gpu.md").exists()

    def only(*words: str) -> dict:  # the one vitlab process with these arguments (torchrun's launcher is not)
        found = [r for r in records_of(log, *words) if r["argv"][0].endswith("__main__.py")]
        assert len(found) == 1, (words, [f["argv"] for f in found])
        return found[0]

    for run, precision in (("bf16", "bfloat16"), ("fp16", "float16")):
        seen, counts = only("train", f"--{run}", str(work / run))["seen"], only("train", f"--{run}", str(work / run))["counts"]
        assert seen["set_device"] == ["cuda:0"] and seen["autocast"] == [precision]
        assert counts["pin_memory"] > 0 and counts["to cuda non_blocking"] > 0 and seen["get_rng_state"] == ["cuda:0"]
    fp16 = only("--fp16")["seen"]
    assert fp16["GradScaler"] == ["enabled"] and "applied" in fp16["GradScaler.step"]
    resumed = only("--resume")["seen"]
    assert resumed["set_rng_state"] == ["cuda:0"] and resumed["GradScaler"] == ["enabled"]
    with safe_open(str(work / "fp16" / "checkpoints" / "step-00000009.state.safetensors"), framework="pt") as f:
        assert 0 < json.loads(f.metadata()["state"])["grad_scaler"]["scale"] <= 65536
    for command in ("finetune", "eval", "predict"):
        assert only(command)["seen"]["autocast"] == ["bfloat16"], command
    assert only("export", "onnx")["counts"]["to cuda"] > 0 and only("export", "torch-export")["counts"]["to cuda"] > 0
    worker = only("train", str(work / "torchrun"))
    assert worker["rank"] == "0" and worker["seen"]["set_device"] == ["cuda:0"] and "init_process_group" not in worker["seen"]
    bench = only("bench")["seen"]
    assert bench["synchronize"] == ["cuda:0"] and "reset_peak_memory_stats" in only("bench")["counts"]
    pipeline = [r for r in fake_gpu.read_log(log) if r["argv"][0].endswith("pipeline.py")]
    assert len(pipeline) == 1 and pipeline[0]["seen"]["decode_jpeg cuda"] == ["decoded"]
