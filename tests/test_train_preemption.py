"""A signal stops a training run at a step boundary with a checkpoint (exit status 75, the
same command continues), and the continued run ends with the weights of a run never stopped,
bit for bit. Slurm's side (the requeue, srun's tasks) is tests/test_slurm.py's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from vitlab.train.preemption import EXIT_STATUS, requeue

STEPS = 40
# One data-loader worker: Slurm signals every process of a job, the worker included.
ARGS = ["--steps", str(STEPS), "--batch-size", "32", "--ckpt-every", "5", "--seed", "3", "--quiet",
        "model.hidden_size=32", "model.depth=2", "model.num_heads=2", "model.mlp_dim=64", "model.image_size=8",
        "model.patch_size=4", "data.num_workers=1", "train.threads=1", "optim.warmup_steps=2"]


def start(command: str, out, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "vitlab", command, "--out", str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def train(out, *extra: str) -> subprocess.Popen:
    return start("train", out, *ARGS, *extra)


def signal_after_first_checkpoint(p: subprocess.Popen, out, number: int) -> None:
    """Send `number` to the run's whole process group (as Slurm does: the workers too) once
    its first step checkpoint exists (whichever step: pruning may already have removed step 5's on
    a fast machine), so that the run is mid-way."""
    deadline = time.monotonic() + 240
    while not list(out.glob("**/step-*.safetensors")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert p.poll() is None, p.communicate()[1][-3000:]
    os.killpg(p.pid, number)


def weights(out):
    return load_file(str(out / "checkpoints" / "last.safetensors"))


@pytest.mark.slow
def test_a_stop_signal_checkpoints_and_the_same_command_continues_bit_exactly(tmp_path):
    straight = train(tmp_path / "straight")
    stopped = train(tmp_path / "stopped")
    signal_after_first_checkpoint(stopped, tmp_path / "stopped", signal.SIGTERM)
    _, err = stopped.communicate(timeout=240)
    assert stopped.returncode == EXIT_STATUS, err[-3000:]
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("vitlab train: stopped: SIGTERM at step ") and "run the same command again" in line, err
    step = int(line.split("at step ")[1].split()[0])
    assert 5 <= step < STEPS  # it stopped mid-way, at a step boundary, with that step's checkpoint
    assert (tmp_path / "stopped" / "checkpoints" / f"step-{step:08d}.safetensors").is_file()
    assert not (tmp_path / "stopped" / "summary.json").exists()

    again = train(tmp_path / "stopped")
    _, err = again.communicate(timeout=240)
    assert again.returncode == 0, err[-3000:]
    assert straight.wait(timeout=240) == 0, straight.communicate()[1][-3000:]
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "stopped")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)  # bit for bit


@pytest.mark.slow
def test_a_fine_tune_stops_on_the_signals_it_is_given_and_others_keep_their_meaning(tmp_path, digits_run):
    """vitlab finetune with train.stop_signals=[USR2]: SIGUSR2 stops it with a checkpoint and the
    same command finishes it; SIGUSR1 is then not vitlab's and does what it does by default."""
    tune = ["--from", str(digits_run / "checkpoints" / "last.safetensors"), "--data", "digits", "--lr", "0.01",
            "--steps", "30", "--ckpt-every", "5", "--batch-size", "32", "--quiet", "train.threads=1",
            "data.num_workers=1", "train.stop_signals=[USR2]"]
    p, q = start("finetune", tmp_path / "usr2", *tune), start("finetune", tmp_path / "usr1", *tune)
    signal_after_first_checkpoint(p, tmp_path / "usr2", signal.SIGUSR2)
    signal_after_first_checkpoint(q, tmp_path / "usr1", signal.SIGUSR1)
    _, err = p.communicate(timeout=240)
    assert p.returncode == EXIT_STATUS and "vitlab finetune: stopped: SIGUSR2 at step" in err, err[-3000:]
    q.communicate(timeout=240)
    assert q.returncode == -signal.SIGUSR1
    again = start("finetune", tmp_path / "usr2", *tune)
    _, err = again.communicate(timeout=240)
    assert again.returncode == 0, err[-3000:]
    (summary,) = (tmp_path / "usr2").glob("**/summary.json")
    assert json.loads(summary.read_text())["steps"] == 30


def test_requeue_outside_slurm_on_scancels_signal_and_where_slurm_refuses(tmp_path):
    assert requeue("SIGUSR1", {}) == "run the same command again to continue from there"
    # A job id with no scontrol that knows it: said, with how the run continues.
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho \"$@\" >> \"$0.called\"\n"
                        "echo 'scontrol: error: Requested operation is presently disabled for job 7' >&2\nexit 1\n")
    scontrol.chmod(0o755)
    job = {"SLURM_JOB_ID": "7", "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    line = requeue("SIGUSR1", job)
    assert line.startswith("Slurm job 7 not requeued (scontrol: error: Requested operation is presently disabled")
    assert line.endswith("run the same command again to continue from there")
    # SIGTERM is scancel's signal too: a job requeued on it could not be cancelled.
    line = requeue("SIGTERM", job)
    assert line.startswith("Slurm job 7 not requeued on SIGTERM, which scancel sends too")
    assert (tmp_path / "scontrol.called").read_text() == "requeue 7\n"  # asked once, for SIGUSR1 only


def test_data_loader_workers_leave_the_stop_signals_to_their_parent():
    """Under fork a worker inherits the trainer's handlers; under spawn or forkserver it would
    not, and Slurm's SIGTERM to every process would end it before the checkpoint."""
    from vitlab.config import STOP_SIGNALS
    from vitlab.data.loader import leave_signals_to_parent

    numbers = [getattr(signal, f"SIG{name}") for name in STOP_SIGNALS]
    before = {n: signal.getsignal(n) for n in numbers}
    try:
        leave_signals_to_parent(0)
        assert all(signal.getsignal(n) is signal.SIG_IGN for n in numbers)
    finally:
        for n, handler in before.items():
            signal.signal(n, handler)


@pytest.mark.slow
def test_ctrl_c_stops_a_fine_tunes_final_run_with_a_checkpoint_and_says_how_to_continue(tmp_path, digits_run):
    """Ctrl-C (SIGINT to the terminal's process group, the data-loader worker included) is a
    stop signal whatever train.stop_signals says: the fine-tune's final run keeps the
    checkpoint of the step it stopped at, the command exits 130 saying how to continue, and
    the same command finishes the run."""
    tune = ["--from", str(digits_run / "checkpoints" / "last.safetensors"), "--data", "digits", "--lr", "0.01",
            "--steps", "30", "--ckpt-every", "5", "--batch-size", "32", "--quiet", "train.threads=1",
            "data.num_workers=1", "train.stop_signals=[USR2]"]
    p = start("finetune", tmp_path / "ft", *tune)
    signal_after_first_checkpoint(p, tmp_path / "ft", signal.SIGINT)
    _, err = p.communicate(timeout=240)
    assert p.returncode == 130 and "Traceback" not in err, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("vitlab finetune: stopped: SIGINT at step ") and "run the same command again" in line, err
    step = int(line.split("at step ")[1].split()[0])
    assert list((tmp_path / "ft").glob(f"**/checkpoints/step-{step:08d}.safetensors"))
    again = start("finetune", tmp_path / "ft", *tune)
    _, err = again.communicate(timeout=240)
    assert again.returncode == 0, err[-3000:]
    (summary,) = (tmp_path / "ft").glob("**/summary.json")
    assert json.loads(summary.read_text())["steps"] == 30
