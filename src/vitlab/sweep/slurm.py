"""Slurm as a launcher of vitlab sweep and vitlab vtab: submitit's executor, told how to read
the queue of a cluster without accounting, and a failed job said in one line.

submitit asks `sacct` for the states of its jobs. Many small clusters run without accounting
(AccountingStorageType=accounting_storage/none, no slurmdbd): sacct then fails on every poll,
and submitit warns each time that the states may be wrong. On such a cluster vitlab says once
that the states come from squeue and reads them there (`squeue --states=all`, which lists a
finished job for MinJobAge, 5 minutes by default; a job gone from it has ended). A job's
result is its result file all the same, which is how a job counts as done.

A job's time limit is the one asked for (`--slurm timeout_min=MINUTES`), else its
partition's, as for a script sbatch'ed without --time (submitit would ask for 5 minutes).
Before a job's time limit, and where the cluster preempts with it, Slurm sends the job the
signal submitit asks for (SIGUSR2, 90 s ahead): the cell's training (`Stoppable`) then stops
at its next step with a checkpoint, and submitit requeues the job, which continues the cell
where it stopped. The training itself leaves that signal and the requeue to the job.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from vitlab.config import ConfigError
from vitlab.config.fields import is_digits

Say = Callable[[str], None]
ACCOUNTING_OFF = "accounting_storage/none"
GONE = "LEFT_QUEUE"  # the state of a job squeue no longer lists: it has ended
UNLIMITED_MIN = 365 * 24 * 60  # what a job asks for on a partition without a time limit
STOP_WAIT = 60  # seconds a training may take to reach its step's end and checkpoint (of submitit's 90)


def _scontrol(*args: str) -> str:
    """What `scontrol ARGS` prints ("" when it cannot say)."""
    path = shutil.which("scontrol")
    if path is None:
        return ""
    try:
        return subprocess.run([path, *args], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def accounting() -> str:
    """The cluster's AccountingStorageType ("" when scontrol cannot say)."""
    for line in _scontrol("show", "config").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return value.strip()
    return ""


def minutes(limit: str) -> Optional[int]:
    """A Slurm time limit in minutes, rounded up, read as sbatch reads --time ("45" minutes,
    "30:00" minutes:seconds, "4:00:00", "2-00:00:00", "2-12" days-hours); None for none
    ("UNLIMITED", "infinite", "NONE")."""
    days, _, clock = limit.strip().rpartition("-")
    if not re.fullmatch(r"[0-9]+(:[0-9]+){0,2}", clock) or days and not is_digits(days):
        return None
    parts = [int(x) for x in clock.split(":")]
    if days or len(parts) == 3:
        h, m, sec = (parts + [0, 0])[:3]
    else:
        h, m, sec = 0, parts[0], (parts + [0])[1]
    return int(days or 0) * 1440 + h * 60 + m + (sec > 0)


def partition_limit(partition: str = "") -> tuple[str, Optional[int]]:
    """(name, minutes) of the time limit a job without --time gets on `partition` (the default
    one when ""): its DefaultTime, else its MaxTime; minutes None when unlimited, ("", None)
    when scontrol cannot say."""
    for line in _scontrol("show", "partition", "--oneliner").splitlines():
        fields = dict(x.split("=", 1) for x in line.split() if "=" in x)
        if fields.get("PartitionName") == partition or not partition and fields.get("Default") == "YES":
            default = fields.get("DefaultTime", "NONE")
            return fields["PartitionName"], minutes(default if minutes(default) is not None else fields.get("MaxTime", ""))
    return "", None


def time_limit(params: dict[str, Any], say: Say) -> dict[str, Any]:
    """`params` with the job's time limit: the one asked for, else the partition's (said once)."""
    if "timeout_min" in params or "slurm_time" in params:
        return params
    name, limit = partition_limit(str(params.get("slurm_partition", "")))
    if not name:
        say("Slurm jobs ask for submitit's 5 minutes (no partition's time limit could be read); "
            "--slurm timeout_min=MINUTES asks for more")
        return params
    shown = "unlimited" if limit is None else f"{limit} minutes"
    say(f"Slurm jobs ask for the time limit of partition {name} ({shown}); --slurm timeout_min=MINUTES asks for another")
    return {**params, "timeout_min": UNLIMITED_MIN if limit is None else limit}


def queue_job_class(submitit: Any) -> type:
    """A SlurmJob whose states come from squeue instead of sacct (one watcher for all its jobs)."""
    from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob  # submitit is the sweep extra's

    class QueueWatcher(SlurmInfoWatcher):
        def _make_command(self):
            if not self._registered - self._finished:
                return None
            return ["squeue", "--noheader", "--states=all", "--format=%i|%T|%N", "--user", getpass.getuser()]

        def read_info(self, string):
            text = string if isinstance(string, str) else string.decode()
            info = super().read_info("JobID|State|NodeList\n" + text)
            for job in self._registered - self._finished - set(info):
                info[job] = {"JobID": job, "State": GONE, "NodeList": ""}
            return info

    class QueueJob(SlurmJob):
        watcher = QueueWatcher(delay_s=600)

    return QueueJob


class Stoppable:
    """A sweep cell or VTAB task (`run(*args, job=self)`, runner.run_cell) as a Slurm job that
    submitit checkpoints and requeues on its signal (SIGUSR2, before the time limit or at a
    preemption). Slurm sends that signal to every process of the job: the cell's training
    ignores it (`start`), and `checkpoint` stops the training with SIGTERM, at its next step
    with a checkpoint (train.stop_signals), before submitit requeues the job; the job then runs
    the cell again, which continues from that checkpoint. The training runs without the
    job's SLURM_ variables: it is the job's child, not a task of it, and the job requeues."""

    def __init__(self, run: Callable[..., Any]):
        self.run = run
        self.child: Optional[subprocess.Popen] = None

    def __call__(self, *args: Any) -> Any:
        return self.run(*args, job=self)

    def start(self, argv: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen:
        from submitit.slurm.slurm import SlurmJobEnvironment  # the signal submitit asks Slurm for

        number = getattr(signal, f"SIG{SlurmJobEnvironment.USR_SIG}")
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
        child = subprocess.Popen(argv, env=env, preexec_fn=lambda: signal.signal(number, signal.SIG_IGN), **kwargs)
        self.child = child
        return child

    def checkpoint(self, *args: Any) -> Any:
        from submitit.helpers import DelayedSubmission

        child, self.child = self.child, None
        if child is not None and not _ended(child.pid, 0):
            os.kill(child.pid, signal.SIGTERM)
            if not _ended(child.pid, STOP_WAIT):  # it resumes from its last periodic checkpoint instead
                os.kill(child.pid, signal.SIGKILL)
                _ended(child.pid, STOP_WAIT)
        # submitit now runs `scontrol requeue` as a child of this process, and the requeue makes
        # Slurm send SIGTERM to every process of the job: a scontrol that had not exited yet died
        # of it, submitit recorded the job as failed, and the launcher read that result although
        # the requeued job then finished. An ignored signal stays ignored across exec, so the
        # scontrol child outlives it; this process ignores it too (submitit only logs it anyway).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return DelayedSubmission(self, *args)

    def __getstate__(self) -> dict[str, Any]:
        return {"run": self.run}  # not the child: the job's state is its folder

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.run, self.child = state["run"], None


def _ended(pid: int, seconds: float) -> bool:
    """Whether child `pid` has ended, waiting up to `seconds`. It is not reaped: this runs in
    submitit's signal handler, while the cell's own Popen.wait holds the child (and its lock)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # already reaped
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def executor(submitit: Any, folder: Path, say: Say) -> Any:
    """submitit's Slurm executor; on a cluster without accounting, one that reads squeue (said once)."""
    ex = submitit.AutoExecutor(folder=str(folder), cluster="slurm")
    if accounting() == ACCOUNTING_OFF and hasattr(getattr(ex, "_executor", None), "job_class"):
        ex._executor.job_class = queue_job_class(submitit)
        say("Slurm accounting is off on this cluster (no sacct): job states come from squeue")
    return ex


def submit(executor: Any, calls: list[tuple], who: str) -> list[Any]:
    """Submit each (function, *args) as a job. A job the scheduler refuses (a partition it
    lacks, a limit) is one line naming sbatch's reason; submitit would print sbatch's lines too."""
    from submitit.core.utils import FailedJobError

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return [executor.submit(*call) for call in calls]
    except FailedJobError as e:
        reasons = list(dict.fromkeys(x.strip() for x in str(e).splitlines() if x.strip()))
        raise ConfigError(f"{who}: Slurm refused the job: {'; '.join(reasons) or 'sbatch failed'}") from None
    finally:
        if said.getvalue() and sys.exc_info()[0] is None:
            sys.stderr.write(said.getvalue())  # what else was said while submitting (warnings)


def failure(job: Any, error: BaseException) -> dict[str, Any]:
    """A job that ended without a result (killed, out of time, its node lost, refused): one
    line, its state and where its log is, and submitit's reason (else the log's last line)."""
    try:
        state = job.state
    except Exception:  # the state is a courtesy here; the job has failed either way
        state = "UNKNOWN"
    log = Path(job.paths.stderr)
    try:
        lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        lines = []
    reasons = [x.split("Job not requeued because: ", 1)[1].rstrip(".") for x in lines if "Job not requeued because: " in x]
    last = reasons[-1] if reasons else lines[-1] if lines else f"{type(error).__name__}, and its log {log} is empty or absent"
    if "timed-out" in last or state == "TIMEOUT":
        last += " (each job's time limit: --slurm timeout_min=MINUTES)"
    return {"status": "failed", "step": "job", "why": f"Slurm job {job.job_id} ended without a result ({state})",
            "log": str(log), "tail": last}
