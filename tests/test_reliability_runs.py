"""Reliability of training runs under faults and concurrency: two processes on one run folder,
kill -9 at random points and in the middle of writing a checkpoint, a damaged newest
checkpoint, a corrupt config.yaml, a run that died before its first checkpoint, a full disk
(RLIMIT_FSIZE in the child), and the permissions of what a run writes (train/run_folder.py,
train/state.py)."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import vitlab
from conftest import assert_one_line_error, obey_permissions, tree_state, vitlab_cli
from vitlab.cli import main
from vitlab.config import RunConfig
from vitlab.train import state
from vitlab.train.run_folder import LOCK_FILE, RunFolder

# 60 steps of a tiny ViT on the built-in digits, a checkpoint every 20: seconds per run.
RUN = ["--steps", "60", "--ckpt-every", "20", "--batch-size", "32", "--quiet", "model.image_size=8", "model.patch_size=4",
       "model.hidden_size=32", "model.depth=1", "model.num_heads=2", "model.mlp_dim=64", "train.threads=1",
       "train.log_every=5", "train.keep_checkpoints=5"]
LONG = [a if a != "60" else "2000" for a in RUN]  # long enough to be caught running


def start(out: Path, args=RUN, preexec_fn=None, code: str = "") -> subprocess.Popen:
    """`vitlab train --out OUT ARGS` in a child; `code` runs in it first (a fault to inject)."""
    argv = ["train", "--out", str(out), *args]
    script = f"import sys\n{code}\nfrom vitlab.cli import main\nsys.exit(main({argv!r}))"
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=preexec_fn)


def finish(p: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def metric_steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["split"] == "train"]


def wait_for_step(out: Path, p: subprocess.Popen, step: int, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while (state.latest(out / "checkpoints") or 0) < step:
        assert p.poll() is None, p.communicate()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The uninterrupted run every faulted run must end up equal to."""
    out = tmp_path_factory.mktemp("straight") / "run"
    rc, _, err = finish(start(out))
    assert rc == 0, err
    return out


# One process per run folder ------------------------------------------------------------------
def test_two_trainings_into_one_folder_one_runs_the_other_is_told_who(tmp_path):
    out = tmp_path / "run"
    first = start(out, LONG)
    wait_for_step(out, first, 20)
    rc, _, err = finish(start(out, [*LONG, "--seed", "7"]))
    assert_one_line_error(rc, err, "train", mentions=(f"PID {first.pid}", "in use by another vitlab process"))
    again = subprocess.run([sys.executable, "-m", "vitlab", "train", "--resume", str(out)], capture_output=True,
                           text=True, timeout=120)
    assert_one_line_error(again.returncode, again.stderr, "train", mentions=(f"PID {first.pid}",))
    first.kill()
    first.wait()
    assert RunConfig.from_dict(__import__("yaml").safe_load((out / "config.yaml").read_text())).train.seed == 0
    steps = metric_steps(out)
    assert steps == sorted(set(steps))  # one writer: no line twice


def test_the_lock_goes_with_the_process_even_on_kill_9(tmp_path, straight):
    """A killed run's folder is free at once: its data-loader workers do not keep the lock."""
    out = tmp_path / "run"
    victim = start(out, [*RUN, "data.num_workers=2"])
    wait_for_step(out, victim, 20)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    folder = RunFolder(out)
    folder.claim()  # would raise RunFolderBusy if a worker still held it
    folder.release()
    rc, _, err = finish(start(out, [*RUN, "data.num_workers=2"]))
    assert rc == 0, err
    assert_same_weights(out / "checkpoints" / "last.safetensors", straight / "checkpoints" / "last.safetensors")


# kill -9 ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_kill_9_at_random_points_then_resume_is_exact(tmp_path, straight):
    out = tmp_path / "run"
    rng = random.Random(11)
    for _ in range(3):
        victim = start(out)
        time.sleep(rng.uniform(1.0, 6.0))  # anywhere: start-up, training, checkpointing, the end
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        leftovers = [p.name for p in out.rglob("*") if p.name.endswith(".tmp")] if out.exists() else []
        assert all(name.startswith(".") for name in leftovers)
    rc, _, err = finish(start(out))
    assert rc == 0, err
    assert not [p for p in out.rglob("*.tmp")]  # half-written files of the killed runs are gone
    assert_same_weights(out / "checkpoints" / "last.safetensors", straight / "checkpoints" / "last.safetensors")
    assert metric_steps(out) == metric_steps(straight)


DIE_WHILE_WRITING = """
import os, signal
import safetensors.torch as st
real, calls = st.save_file, []
def dying(tensors, filename, metadata=None):
    calls.append(filename)
    if len(calls) == {n}:  # this write: half of it, then kill -9
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(os.path.getsize(filename) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(tensors, filename, metadata=metadata)
st.save_file = dying
"""


@pytest.mark.parametrize("n, what", [(3, "the state file of step 40"), (4, "the model file of step 40")])
def test_kill_9_in_the_middle_of_writing_a_checkpoint(tmp_path, straight, n, what):
    """Writes 1-2 are step 20's state and model files, 3-4 step 40's: killed halfway through
    either, the step-20 checkpoint is whole and the rerun ends where the straight run does."""
    out = tmp_path / "run"
    victim = start(out, code=DIE_WHILE_WRITING.format(n=n))
    victim.communicate(timeout=300)
    assert victim.returncode == -signal.SIGKILL, what
    assert state.latest(out / "checkpoints") == 20
    assert vitlab.load(out / "checkpoints" / "last.safetensors").config.hidden_size == 32
    assert [p.name for p in (out / "checkpoints").iterdir() if p.name.endswith(".tmp")]  # the half-written one
    rc, _, err = finish(start(out))
    assert rc == 0, err
    assert not list(out.rglob("*.tmp"))
    assert_same_weights(out / "checkpoints" / "last.safetensors", straight / "checkpoints" / "last.safetensors")


@pytest.fixture(scope="module")
def killed_template(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("killed") / "run"
    victim = start(out, code=DIE_WHILE_WRITING.format(n=5))  # dies writing step 60: checkpoints 20 and 40
    victim.communicate(timeout=300)
    assert state.latest(out / "checkpoints") == 40
    return out


@pytest.fixture
def killed_at_40(tmp_path, killed_template) -> Path:
    """A run killed while writing its step-60 checkpoint (a copy of one, per test)."""
    import shutil

    shutil.copytree(killed_template, tmp_path / "run", copy_function=shutil.copy2)
    return tmp_path / "run"


def test_a_truncated_newest_checkpoint_falls_back_and_says_so(killed_at_40, straight):
    out = killed_at_40
    newest = out / "checkpoints" / "step-00000040.safetensors"
    newest.write_bytes(newest.read_bytes()[:1000])
    rc, _, err = finish(start(out))
    assert rc == 0, err
    assert "step 40 is damaged" in err and "falling back" in err and "Traceback" not in err
    assert_same_weights(out / "checkpoints" / "last.safetensors", straight / "checkpoints" / "last.safetensors")


@pytest.mark.parametrize("content", [b"model: [unclosed", b"\xff\xfe\x00garbage", b"just a string", b"train: {batch_size: -4}"])
def test_a_corrupt_config_yaml_on_resume_is_one_line_and_keeps_the_checkpoints(killed_at_40, content):
    out = killed_at_40
    (out / "config.yaml").write_bytes(content)
    for p in out.rglob("*.tmp"):  # the killed run's half-written file (a rerun removes it)
        p.unlink()
    before = tree_state(out, skip=(out / LOCK_FILE,))
    for args in (["train", "--resume", str(out)], ["train", "--out", str(out), *RUN]):
        r = vitlab_cli(*args)
        assert_one_line_error(r.returncode, r.stderr, "train", mentions=("config.yaml",))
    assert tree_state(out, skip=(out / LOCK_FILE,)) == before


def test_a_log_line_cut_short_and_a_damaged_summary(killed_at_40, tmp_path, capsys):
    """A crash or a full disk can cut the last metrics line: the resumed run drops it. A
    finished run's damaged summary.json is one line, not a traceback."""
    out = killed_at_40
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 41, "split": "tr')
    rc, _, err = finish(start(out))
    assert rc == 0, err
    assert metric_steps(out) == list(range(5, 65, 5))
    (out / "summary.json").write_text("{not json")
    refused = main(["train", "--out", str(out), *RUN])
    assert_one_line_error(refused, capsys.readouterr().err, "train", mentions=("summary.json",))


def test_a_run_that_died_before_its_first_checkpoint_reruns_with_another_flag(tmp_path, capsys):
    out = tmp_path / "run"
    folder = RunFolder(out)
    out.mkdir()
    folder.write_config(RunConfig.from_dict({"train": {"steps": 60}}))
    folder.metrics.write_text('{"step": 5, "split": "train", "loss": 2.3}\n')
    old_config, old_log = folder.config.read_text(), folder.metrics.read_text()
    assert main(["train", "--out", str(out), "--skip-bad-images", *RUN]) == 0
    err = capsys.readouterr().err
    assert "died before its first checkpoint" in err and "config.1.yaml, metrics.1.jsonl" in err
    assert (out / "config.1.yaml").read_text() == old_config and (out / "metrics.1.jsonl").read_text() == old_log
    assert RunFolder(out).read_config().data.skip_bad_images


# A full disk, unwritable places ----------------------------------------------------------------------
def limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_stops_the_run_in_one_line_and_loses_nothing(killed_at_40):
    """A file-size limit of 60 kB in the child: the next checkpoint's state file (about
    100 kB) cannot be written. The run stops with one line; the checkpoints and the log it
    had are intact, and the rerun without the limit finishes."""
    out = killed_at_40
    before = tree_state(out, skip=(out / LOCK_FILE,))
    rc, _, err = finish(start(out, preexec_fn=limit_file_size(60_000)))
    assert_one_line_error(rc, err, "train", mentions=("File too large",))
    after = tree_state(out, skip=(out / LOCK_FILE, out / "metrics.jsonl", out / "tensorboard", out / "config.yaml"))
    assert {k: v for k, v in before.items() if k in after} == {k: v for k, v in after.items() if k in before}
    assert (out / "checkpoints" / "step-00000040.safetensors").exists() and state.latest(out / "checkpoints") == 40
    assert not list(out.rglob("*.tmp"))
    assert metric_steps(out)[:8] == list(range(5, 45, 5))
    rc, _, err = finish(start(out))
    assert rc == 0, err


def test_a_full_disk_in_convert_keeps_the_old_file(tmp_path):
    src = tmp_path / "m.safetensors"
    vitlab.save(vitlab.create_model("ViT-Ti/16", depth=1, image_size=32, num_classes=3), src)
    dst = tmp_path / "out.safetensors"
    dst.write_bytes(b"an earlier file")
    r = subprocess.run([sys.executable, "-m", "vitlab", "convert", str(src), str(dst), "--force"], capture_output=True,
                       text=True, timeout=120, preexec_fn=limit_file_size(100_000))
    assert_one_line_error(r.returncode, r.stderr, "convert", mentions=("File too large",))
    assert dst.read_bytes() == b"an earlier file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors", "out.safetensors"]


def test_a_read_only_checkpoint_folder_is_found_before_the_work(killed_at_40, read_only):
    """Resuming into a run whose checkpoints/ has mode 0555 (a child that obeys permissions,
    even as root) stops at once, naming the folder, not 20 steps later at the next
    checkpoint; nothing in the run changes."""
    out = killed_at_40
    for p in out.rglob("*.tmp"):
        p.unlink()
    (out / "checkpoints").chmod(0o555)
    before = tree_state(out, skip=(out / LOCK_FILE,))
    try:
        for args in (["--out", str(out), *RUN], ["--resume", str(out), "--quiet"]):
            r = vitlab_cli("train", *args, preexec_fn=obey_permissions)
            assert_one_line_error(r.returncode, r.stderr, "train",
                                  mentions=(f"cannot write {out / 'checkpoints'}", "Permission denied"))
    finally:
        (out / "checkpoints").chmod(0o755)
    assert tree_state(out, skip=(out / LOCK_FILE,)) == before


def test_what_a_run_writes_has_normal_permissions(straight):
    files = [p for p in straight.rglob("*") if p.is_file()]
    assert {p.stat().st_mode & 0o777 for p in files} == {0o644}, {str(p): oct(p.stat().st_mode & 0o777) for p in files}
    assert {p.stat().st_mode & 0o777 for p in straight.rglob("*") if p.is_dir()} == {0o755}
