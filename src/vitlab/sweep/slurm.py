"""Slurm as a launcher of vitlab sweep and vitlab vtab: submitit's executor, told how to read
the queue of a cluster without accounting, and a failed job said in one line.

submitit asks `sacct` for the states of its jobs. Many small clusters run without accounting
(AccountingStorageType=accounting_storage/none, no slurmdbd): sacct then fails on every poll,
and submitit warns each time that the states may be wrong. On such a cluster vitlab says once
that the states come from squeue and reads them there (`squeue --states=all`, which lists a
finished job for MinJobAge, 5 minutes by default; a job gone from it has ended). A job's
result is its result file all the same, which is how a job counts as done.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from vitlab.config import ConfigError

Say = Callable[[str], None]
ACCOUNTING_OFF = "accounting_storage/none"
GONE = "LEFT_QUEUE"  # the state of a job squeue no longer lists: it has ended


def accounting(scontrol: str = "scontrol") -> str:
    """The cluster's AccountingStorageType ("" when scontrol cannot say)."""
    path = shutil.which(scontrol)
    if path is None:
        return ""
    try:
        shown = subprocess.run([path, "show", "config"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    for line in shown.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return value.strip()
    return ""


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
    line, its state and where its log is, and the last line of that log."""
    try:
        state = job.state
    except Exception:  # the state is a courtesy here; the job has failed either way
        state = "UNKNOWN"
    log = Path(job.paths.stderr)
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        lines = []
    last = lines[-1].strip() if lines else f"{type(error).__name__}, and its log {log} is empty or absent"
    return {"status": "failed", "step": "job", "why": f"Slurm job {job.job_id} ended without a result ({state})",
            "log": str(log), "tail": last}
