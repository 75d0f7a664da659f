"""vitlab on a running Slurm cluster, as its users run it: a two-task DDP training through srun
(one process group, one run folder) preempted and requeued, ending with the weights of an
uninterrupted run bit for bit; a cancelled job that stays cancelled; `vitlab sweep --launcher
slurm` and `vitlab vtab --launcher slurm` through submitit on a cluster without accounting (no
sacct warnings: the states come from squeue, said once), a task's job preempted and requeued;
a failing cell's one-line error and a refused job's reason reaching the user. .ci/run starts
the two-node cluster (tools/slurm-cluster start); where none answers, these tests skip and
say how to start one. The first tests need no cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from PIL import Image
from safetensors.torch import load_file

from conftest import ROOT, assert_one_line_error
from vitlab.data.datasets import digits_arrays
from vitlab.sweep.slurm import GONE, failure, minutes, queue_job_class
from vitlab.train.distributed import first_host, launch
from vitlab.train.preemption import EXIT_STATUS

STEPS = 40
COMMON = ["--batch-size", "32", "--ckpt-every", "5", "--seed", "3", "--quiet",
         "model.hidden_size=32", "model.depth=2", "model.num_heads=2", "model.mlp_dim=64", "model.image_size=8",
         "model.patch_size=4", "data.num_workers=0", "train.threads=1", "optim.warmup_steps=2"]
LONG_STEPS = 400  # the preempted job: signalled after its first checkpoint, it must still be training
TRAIN = ["--steps", str(STEPS), *COMMON]
LONG = ["--steps", str(LONG_STEPS), *COMMON]  # an option given twice is refused: each list names --steps once


# Without a cluster: what a process reads of Slurm's environment and of squeue -----------------
def test_srun_tasks_form_one_group_and_torchrun_wins_over_slurm():
    task = {"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    me = launch(task)
    assert (me.rank, me.world, me.local_rank) == (1, 4, 1) and me.init.startswith("tcp://gpu07:")
    assert launch({**task, "SLURM_PROCID": "0"}).init == me.init  # every task meets at the same place
    assert launch({**task, "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29400"}).init == "tcp://10.0.0.2:29400"
    batch = {k: v for k, v in task.items() if k != "SLURM_STEP_ID"}  # the batch script of a 4-task job
    assert launch({**batch, "SLURM_PROCID": "0"}).world == 1
    assert launch({**task, "SLURM_STEP_NUM_TASKS": "1"}).world == 1
    torchrun = launch({**task, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"})
    assert (torchrun.rank, torchrun.world, torchrun.init) == (5, 8, "")  # env://, torchrun's own rendezvous


def test_queue_states_come_from_squeue_and_a_job_gone_from_it_has_ended():
    pytest.importorskip("submitit")
    watcher = queue_job_class(__import__("submitit")).watcher.__class__(delay_s=600)
    for job in ("12", "13", "14_1", "99"):
        watcher.register_job(job)
    info = watcher.read_info("12|RUNNING|node1\n13|COMPLETED|node1\n14_[0-3]|PENDING|\n")
    assert {j: info[j]["State"] for j in ("12", "13", "14_1", "99")} == {
        "12": "RUNNING", "13": "COMPLETED", "14_1": "PENDING", "99": GONE}
    assert watcher._make_command()[:3] == ["squeue", "--noheader", "--states=all"]


def test_time_limits_read_as_sbatch_reads_them_and_a_timed_out_job_names_the_fix(tmp_path):
    limits = {"45": 45, "30:00": 30, "30:01": 31, "4:00:00": 240, "2-00:00:00": 2880, "2-12": 3600, "1-02:03": 1563,
              "UNLIMITED": None, "infinite": None, "NONE": None}
    assert {text: minutes(text) for text in limits} == limits
    log = tmp_path / "7_0_log.err"
    log.write_text("submitit WARNING - Caught signal SIGUSR2 on node1: this job is timed-out.\n"
                   "submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out too many times.\n"
                   "srun: error: node1: task 0: Exited with exit code 1\n")
    job = SimpleNamespace(job_id="7", state="FAILED", paths=SimpleNamespace(stderr=log))
    said = failure(job, RuntimeError())
    assert said["why"] == "Slurm job 7 ended without a result (FAILED)"
    assert said["tail"] == "timed-out too many times (each job's time limit: --slurm timeout_min=MINUTES)"


# On the cluster ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    """A Slurm cluster that takes jobs, or a skip that says how to get one."""
    if shutil.which("sbatch") is None:
        pytest.skip("Slurm is not installed (Debian: apt-get install slurm-wlm munge), and no cluster runs here: "
                    "as root, tools/slurm-cluster start")
    try:
        states = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        states = None
    if states is None or states.returncode != 0 or not {"idle", "mixed", "allocated"} & set(states.stdout.split()):
        said = " ".join(((states.stderr or states.stdout) if states else "sinfo timed out").split())[:200]
        pytest.skip(f"no Slurm cluster takes jobs here ({said or 'no node up'}): as root, tools/slurm-cluster start")


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", GONE)


def job_state(job: str) -> str:
    out = subprocess.run(["squeue", "--noheader", "--states=all", "--jobs", job, "--format=%T"],
                         capture_output=True, text=True).stdout.split()
    return out[0] if out else GONE


def wait_for(condition, what: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds:.0f} s for {what}"
        time.sleep(0.25)


def test_node_lists_read_as_scontrol_expands_them(cluster):
    for nodes in ("localhost", "gpu[07-09,12],cpu3", "rack[1-2]-node[01-02],x", "n[1-3]", "a1,b[2-3]"):
        listed = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True)
        assert first_host(nodes) == listed.stdout.split()[0], nodes


@pytest.mark.slow
def test_a_preempted_two_task_srun_job_requeues_and_ends_as_an_uninterrupted_run(cluster, tmp_path):
    """srun -n 2: one process group from Slurm's variables (world size 2, one run folder, rank 0
    alone writes); SIGUSR1 (what --signal=USR1@SECONDS sends before a time limit) stops both
    tasks at one step with its checkpoint, the job requeues itself, starts again and resumes;
    the final weights are those of the same training run straight through by torchrun. The run is
    long enough (about 15 ms a step here) that the signal, sent once the first checkpoint is
    written, finds it training; the job must end on its own for the comparison."""
    run = tmp_path / "run"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks=2\n#SBATCH --requeue\n#SBATCH --open-mode=append\n"
                      f"#SBATCH --output={tmp_path}/job-%j.out\n"
                      f"srun {sys.executable} -m vitlab train --out {run} {' '.join(LONG)}\n")
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True, env=env(),
                         cwd=ROOT).stdout.strip()
    straight = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                                 "-m", "vitlab", "train", "--out", str(tmp_path / "straight"), *LONG],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    try:
        # a step's checkpoint, whichever (a fast machine has replaced step 5's by the time we look)
        wait_for(lambda: any((run / "checkpoints").glob("step-*.safetensors")) or job_state(job) in ENDED,
                 "the job's first checkpoint")
        subprocess.run(["scancel", "--signal=USR1", job], check=True)
        wait_for(lambda: job_state(job) in ENDED, "the requeued job's end")
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    log = (tmp_path / f"job-{job}.out").read_text()
    assert job_state(job) == "COMPLETED", log[-3000:]
    stopped = [line for line in log.splitlines() if line.startswith("vitlab train: stopped:")]
    assert len(stopped) == 1, log[-3000:]  # rank 0 speaks for the run
    assert "SIGUSR1 at step" in stopped[0] and f"Slurm job {job} requeued" in stopped[0]
    assert stopped[0].endswith(f"(exit status {EXIT_STATUS})") and "Traceback" not in log
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "Restarts=1" in shown, shown
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == LONG_STEPS
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and len(steps) == len(set(steps)) + 1  # once each (train and test at the end)
    _, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err[-3000:]
    a = load_file(str(run / "checkpoints" / "last.safetensors"))
    b = load_file(str(tmp_path / "straight" / "checkpoints" / "last.safetensors"))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)  # bit for bit


@pytest.mark.slow
def test_a_cancelled_job_checkpoints_and_stays_cancelled(cluster, tmp_path):
    """scancel sends SIGTERM: the run writes its checkpoint and says how to continue, and the
    job is not requeued (a job requeued on SIGTERM could never be cancelled)."""
    run = tmp_path / "run"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --requeue\n#SBATCH --output={tmp_path}/job-%j.out\n"
                      f"srun {sys.executable} -m vitlab train --out {run} --steps 100000 {' '.join(COMMON)}\n")  # runs until cancelled
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True, env=env(),
                         cwd=ROOT).stdout.strip()
    try:
        # a step's checkpoint, whichever (a fast machine has replaced step 5's by the time we look)
        wait_for(lambda: any((run / "checkpoints").glob("step-*.safetensors")) or job_state(job) in ENDED,
                 "the job's first checkpoint")
        subprocess.run(["scancel", job], check=True)
        wait_for(lambda: job_state(job) not in ("RUNNING", "COMPLETING", "PENDING", "REQUEUED"), "the job's end")
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    log = (tmp_path / f"job-{job}.out").read_text()
    assert job_state(job) == "CANCELLED", log[-3000:]
    (stopped,) = [line for line in log.splitlines() if line.startswith("vitlab train: stopped:")]
    assert stopped.startswith("vitlab train: stopped: SIGTERM at step ") and "Traceback" not in log
    assert f"Slurm job {job} not requeued on SIGTERM, which scancel sends too" in stopped
    step = int(stopped.split("at step ")[1].split()[0])
    assert (run / "checkpoints" / f"step-{step:08d}.safetensors").is_file()
    time.sleep(6)  # cred_expire: a requeued job would be back by now
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "Restarts=0" in shown and "JobState=CANCELLED" in shown, shown


TINY_SWEEP = {
    "train": {"config": "digits", "steps": 4, "batch-size": 32, "ckpt-every": 2, "model.depth": 1,
              "model.hidden_size": 32, "train.threads": 1},
    "grid": {"model.num_heads": [2, 3]},  # 3 does not divide the width 32: that cell's training fails
    "figures": [],
}


@pytest.mark.slow
def test_sweep_on_slurm_runs_its_cells_says_a_failed_cell_in_one_line_and_no_sacct_noise(cluster, tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(TINY_SWEEP))
    out = tmp_path / "sweep"
    r = subprocess.run([sys.executable, "-m", "vitlab", "sweep", str(spec), "--launcher", "slurm", "--out", str(out)],
                       capture_output=True, text=True, env=env(), timeout=600)
    said = r.stdout + r.stderr
    assert r.returncode == 1, said[-3000:]  # one cell failed
    assert said.count("job states come from squeue") == 1 and "sacct" not in said.replace("(no sacct)", "")
    assert said.count("Slurm jobs ask for the time limit of partition debug (unlimited)") == 1
    assert "WARNING" not in said and "Traceback" not in said
    assert "model.num_heads=2: done in" in r.stdout
    failed = r.stdout[r.stdout.index("model.num_heads=3: FAILED at train (exit code 2)"):]
    assert "hidden_size 32 is not divisible by" in failed.splitlines()[2]
    assert json.loads((out / "num-heads-2" / "train" / "summary.json").read_text())["steps"] == 4
    assert "1 of 2 cells finished" in r.stdout
    # A job the scheduler refuses: sbatch's reason, in the one line.
    bad = subprocess.run([sys.executable, "-m", "vitlab", "sweep", str(spec), "--launcher", "slurm", "--out",
                          str(tmp_path / "refused"), "--slurm", "slurm_partition=nosuchpartition"],
                         capture_output=True, text=True, env=env(), timeout=300)
    assert_one_line_error(bad.returncode, bad.stderr, "sweep", mentions=("Slurm refused the job", "partition"))


@pytest.mark.slow
def test_vtab_on_slurm_runs_a_task_as_a_job_that_is_preempted_and_requeued(cluster, digits_run, tmp_path):
    """A task's job gets the signal submitit asks for (SIGUSR2: the time limit's notice, or a
    preemption): its fine-tune stops at a step with a checkpoint, submitit requeues the job,
    and the job's second start continues the task to its result. The task is long enough (300
    steps) that the signal, sent once its first checkpoint is written, finds it training: a
    30-step task could end between that checkpoint and scancel."""
    root = tmp_path / "vtab"
    d = digits_arrays()  # digits dressed as DTD: image folders train / validation / test
    images, labels = np.concatenate([d["train"][0], d["test"][0]]), np.concatenate([d["train"][1], d["test"][1]])
    for split, (a, b) in {"train": (0, 1000), "validation": (1000, 1300), "test": (1300, 1500)}.items():
        for i in range(a, b):
            folder = root / "dtd" / split / str(labels[i])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i]).save(folder / f"{i:06d}.png")
    out = tmp_path / "suite"
    ckpt = digits_run / "checkpoints" / "last.safetensors"
    p = subprocess.Popen([sys.executable, "-m", "vitlab", "vtab", str(ckpt), "--root", str(root), "--out", str(out),
                          "--tasks", "dtd", "--steps", "300", "--batch-size", "32", "--image-size", "checkpoint",
                          "--quiet", "--launcher", "slurm", "train.ckpt_every=5", "train.threads=1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    run = out / "dtd" / "run"
    try:
        wait_for(lambda: any((run / "checkpoints").glob("step-*.safetensors")) or p.poll() is not None,
                 "the task's first checkpoint")
        (job,) = [x.name.split("_")[0] for x in (out / "submitit").glob("*_submitted.pkl")]
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        said = "".join(p.communicate(timeout=600))
    finally:
        p.kill()
    assert p.returncode == 0, said[-3000:]
    assert said.count("job states come from squeue") == 1 and "WARNING" not in said
    assert "Slurm jobs ask for the time limit of partition debug (unlimited)" in said
    log = (out / "dtd" / "vtab.log").read_text()
    assert "vitlab vtab: stopped: SIGTERM at step" in log and "Traceback" not in log, log[-3000:]
    assert "Restarts=1" in subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    result = json.loads((out / "dtd" / "result.json").read_text())
    assert result["test_images"] == 200 and result["steps"] == 300
    assert json.loads((out / "vtab.json").read_text())["tasks"]["dtd"] == result["top1"]
    assert (out / "submitit" / f"{job}_0_log.out").is_file()  # the job's own log, where submitit keeps it


def test_the_requeue_that_a_checkpoint_asks_for_outlives_the_sigterm_it_brings(tmp_path):
    # After Stoppable.checkpoint, submitit runs `scontrol requeue` as this process's child and
    # Slurm answers with SIGTERM to the whole job; the child must finish (no cluster needed: a
    # shell stands in for scontrol and sends itself the signal), in a fresh process, whose
    # signal dispositions this changes.
    code = (
        "import subprocess, sys\n"
        "from vitlab.sweep.slurm import Stoppable\n"
        "job = Stoppable(lambda *a, job=None: None)\n"
        "job.checkpoint()\n"
        "done = subprocess.run(['sh', '-c', 'kill -TERM $$; echo requeued'], capture_output=True, text=True)\n"
        "print(done.returncode, done.stdout.strip())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "requeued"]
