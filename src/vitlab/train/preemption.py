"""Stopping a training run on a signal and coming back to it: what a cluster's preemption and
time limits need.

Slurm ends a job with SIGTERM (preemption, the time limit, `scancel`), and first sends the
signal a job asks for (`#SBATCH --signal=USR1@120`: SIGUSR1 two minutes before its time
limit). While a run trains, `Watch` turns each of `train.stop_signals` (default TERM and
USR1) into a request noted at the next step boundary, by every process at the same step: the
trainer writes that step's checkpoint and raises `Preempted`, and the run resumes from there
exactly (the same weights as a run never stopped, bit for bit on CPU). The command that
trains (train, finetune, vtab: vitlab.cli.main) then exits with status 75 (EX_TEMPFAIL: "try
again") and, in a Slurm batch job stopped by the notice it asked for (any stop signal but
SIGTERM, which scancel sends), requeues it (`requeue`): when the job starts again, its same
command resumes. A job submitted with --no-requeue is not requeued, and says so.
Outside Slurm the same holds: `kill -TERM` a run, start it again, and it continues. (A
sweep cell's training is not a task of its job: the job requeues, vitlab.sweep.slurm.)

Ctrl-C (SIGINT) is watched the same way, whatever train.stop_signals says: the run stops at
the next step with its checkpoint (a fine-tune's final run and a VTAB task's included), says
how to continue, and the command exits with 130, the status of an interrupted command; a
second Ctrl-C stops at once, from the last checkpoint written.

Data-loader workers ignore these signals (vitlab.data.loader.leave_signals_to_parent), since
Slurm signals every process of a job. A second signal changes nothing: the run is already
stopping, and Slurm's own SIGKILL follows its KillWait (30 s by default) after the first.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Optional

from vitlab.train import distributed

EXIT_STATUS = 75  # sysexits.h EX_TEMPFAIL: stopped with a checkpoint; the same command continues
INTERRUPTED = 130  # the shell's status of a command stopped by Ctrl-C (128 + SIGINT)


class Preempted(Exception):
    """The run stopped on a signal at a step boundary, its checkpoint written. `report` is
    True on the process that speaks for the run (rank 0)."""

    def __init__(self, signal_name: str, step: int, total: int, checkpoint: Optional[Path], report: bool):
        self.signal_name, self.step, self.total, self.checkpoint, self.report = signal_name, step, total, checkpoint, report
        super().__init__(f"{signal_name} at step {step} of {total}; the checkpoint of that step is {checkpoint}")


class Watch:
    """The stop signals, noted while a run trains (from its start to `close`). Installed only
    in the main thread (Python's rule for signal handlers); the previous handlers come back
    on `close`."""

    def __init__(self, names: tuple[str, ...], ctx: distributed.Context):
        self.ctx = ctx
        self.received = ""
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for name in (*names, "INT"):  # Ctrl-C: a checkpoint too, whatever stop_signals says
            number = getattr(signal, f"SIG{name}")
            self.previous[number] = signal.signal(number, self._note)

    def _note(self, number: int, frame: Any) -> None:
        if number == signal.SIGINT and self.received == "SIGINT":
            raise KeyboardInterrupt  # a second Ctrl-C: now, not at the step boundary
        self.received = self.received or signal.Signals(number).name

    def stop_now(self) -> str:
        """The signal to stop on, "" to go on: the same on every process (any process's signal
        stops them all at this step). A collective when the run has several processes and
        watches any signal."""
        if not self.ctx.active or not self.previous:
            return self.received
        if not distributed.any_flag(bool(self.received), self.ctx):
            return ""
        return self.received or "a signal to another process"

    def close(self) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        self.previous = {}


def requeue(signal_name: str, env: Optional[dict[str, str]] = None) -> str:
    """Requeue this Slurm batch job (`scontrol requeue $SLURM_JOB_ID`) and say so; outside
    Slurm, on SIGTERM, or when Slurm refuses (a job submitted with --no-requeue, an
    interactive srun), say how the run continues instead. Called once per job, by rank 0,
    after the checkpoint. SIGTERM does not requeue: it is what `scancel` sends (a job
    requeued on it could not be cancelled), and a cluster that preempts by requeueing
    (PreemptMode=REQUEUE) requeues the job itself; the notice a job asks for before its time
    limit (--signal=USR1@SECONDS) does."""
    env = dict(os.environ) if env is None else env
    again = "run the same command again to continue from there"
    job = env.get("SLURM_JOB_ID", "")
    if not job:
        return again
    if signal_name == "SIGTERM":
        return (f"Slurm job {job} not requeued on SIGTERM, which scancel sends too (a job that asks for "
                f"--signal=USR1@SECONDS before its time limit requeues on that): {again}")
    scontrol = shutil.which("scontrol", path=env.get("PATH"))
    if scontrol is None:
        return f"Slurm job {job} not requeued (no scontrol on this node): {again}"
    main = threading.current_thread() is threading.main_thread()
    # A requeued job's processes get SIGTERM: this one is ending anyway, and says so first.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN) if main else None
    done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, env=env)
    if done.returncode == 0:
        return f"Slurm job {job} requeued: it continues from there when it starts again"
    if main:
        signal.signal(signal.SIGTERM, previous)
    why = " ".join((done.stderr or done.stdout).split()) or f"exit status {done.returncode}"
    return f"Slurm job {job} not requeued ({why}): {again}"


def finish(stopped: Preempted, command: str) -> int:
    """How a command ends on a stopped run: the process that speaks for the run requeues its
    Slurm job (or says how to continue) in one line on stderr; EXIT_STATUS on every process."""
    status = INTERRUPTED if stopped.signal_name == "SIGINT" else EXIT_STATUS
    if stopped.report:
        how = "run the same command again to continue from there" if status == INTERRUPTED else requeue(stopped.signal_name)
        print(f"vitlab {command}: stopped: {stopped}; {how} (exit status {status})", file=sys.stderr)
    return status
