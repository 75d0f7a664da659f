"""Batches for training and evaluation, laid out so that resume and many processes are exact.

An epoch's order is a permutation drawn from (seed, epoch) alone -- no generator state to
carry. Global batch j is positions [j*G, (j+1)*G) of that order (G = the global batch);
process r of W takes the contiguous part [j*G + r*b, j*G + (r+1)*b), b = G / W. So W
processes together see exactly the batches one process would, and a resumed run starts at
batch j by arithmetic. Each item comes with its own augmentation seed (see
`datasets.item_seed`), so which worker or process decodes it does not matter. One loader
serves a whole run, crossing epochs, so its workers start once.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import weakref
from typing import Any, Iterator, Optional

import torch

from vitlab.config import STOP_SIGNALS
from vitlab.data.datasets import BatchLayout, Skipped, item_seed
from vitlab.data.decode import stack_images
from vitlab.data.wds import WebDataset


class EpochBatchSampler(BatchLayout, torch.utils.data.Sampler):
    """Lists of (index, augmentation seed) for one process, laid out by BatchLayout: training
    crosses epochs as needed (one DataLoader, and one set of workers, for the whole run)."""

    def __init__(self, n: int, batch_size: int, seed: int = 0, rank: int = 0, world: int = 1, start_step: int = 0,
                 num_steps: Optional[int] = None, train: bool = True):
        super().__init__(n, batch_size, rank, world, start_step, num_steps, train)
        self.seed = seed

    def order(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(item_seed(self.seed, epoch, "order"))
        return torch.randperm(self.n, generator=g)

    def __iter__(self) -> Iterator[list[tuple[int, Optional[int]]]]:
        if not self.train:
            mine = list(range(self.rank, self.n, self.world))
            for j in range(len(self)):
                yield [(i, None) for i in mine[j * self.b : (j + 1) * self.b]]
            return
        g = self.b * self.world
        epoch, order = -1, []
        for step in range(self.start, self.start + self.num_steps):
            e, j = divmod(step, self.per_epoch)
            if e != epoch:
                epoch, order = e, self.order(e).tolist()
            part = order[j * g + self.rank * self.b : j * g + (self.rank + 1) * self.b]
            yield [(i, item_seed(self.seed, epoch, i)) for i in part]


def collate(items: list) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
    """Stack (image, label) pairs. Unreadable items (`Skipped` names, with --skip-bad-images)
    are dropped and named in the third element, so a run can count distinct files."""
    good = [x for x in items if not isinstance(x, Skipped)]
    bad = tuple(str(x) for x in items if isinstance(x, Skipped))
    return stack_images(good, bad)


HELD = (*STOP_SIGNALS, "INT")  # the signals a run acts on (train/preemption.py); never a worker's
GRACE_S = 3.0  # how long a closed loader's workers get to finish the item in hand before SIGKILL


def leave_signals_to_parent(worker_id: int) -> None:
    """A worker's start: the signals that stop a training run (train.stop_signals) are the main
    process's to act on. Slurm sends them to every process of a job; a worker ended by one
    would end the run before the checkpoint the main process writes at its next step. Ctrl-C
    (SIGINT, sent to the terminal's whole process group) is the main process's too. A worker
    is born with them blocked (`Loader.__iter__`), so none reaches the copy of the parent's
    handler it starts with; ignored, they are unblocked. So SIGTERM cannot end a worker: the
    main process ends its workers itself (`close`, `end_workers`), and a worker leaves when
    its parent is gone."""
    numbers = {getattr(signal, f"SIG{name}") for name in HELD}
    for number in numbers:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, numbers)


@contextlib.contextmanager
def signals_held(replay: bool = True) -> Iterator[None]:
    """The run's signals held back while the block starts or stops workers: blocked in this
    thread (which a forked worker inherits) and noted by the handler, then, with `replay`,
    raised again after the block, so that a Ctrl-C or SIGTERM acts once the workers are in a
    known state (a second Ctrl-C cannot leave half-stopped workers or a data-loader traceback).
    Without `replay` (the command is over) they are dropped. Only the main thread has handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = [getattr(signal, f"SIG{name}") for name in HELD]
    noted: list[int] = []
    previous = {n: signal.signal(n, lambda number, frame: noted.append(number)) for n in numbers
                if signal.getsignal(n) is not None}  # None: a handler set outside Python, left alone
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, numbers)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for n, handler in previous.items():
            signal.signal(n, handler)
        for n in dict.fromkeys(noted) if replay else ():
            signal.raise_signal(n)


_STARTED: "weakref.WeakSet[Any]" = weakref.WeakSet()  # iterators with workers, started in this process
_WORKERS: list[Any] = []  # their worker processes, until ended


class Loader(torch.utils.data.DataLoader):
    """A DataLoader whose workers leave the run's signals to the main process and are ended on
    every way out: `close` (the training loop's `finally`), and `end_workers` (the end of every
    command, and at exit before multiprocessing's own exit hook, which would otherwise wait
    forever on a worker that ignores its SIGTERM)."""

    def __init__(self, *args: Any, **kwargs: Any):
        if kwargs.get("num_workers"):
            kwargs.setdefault("worker_init_fn", leave_signals_to_parent)
        super().__init__(*args, **kwargs)

    def __iter__(self) -> Any:
        with signals_held():
            batches = super().__iter__()
        workers = list(getattr(batches, "_workers", ()))
        if workers:
            _STARTED.add(batches)
            _WORKERS[:] = [w for w in _WORKERS if w.is_alive()] + workers
        return batches


def _kill(workers: list[Any]) -> None:
    for w in workers:
        if w._parent_pid == os.getpid() and w.is_alive():
            w.kill()
    for w in workers:
        if w._parent_pid == os.getpid():
            w.join(1.0)


def close(batches: Any) -> None:
    """Stop an iterator's workers and its pin-memory thread now, within GRACE_S: torch's own
    shutdown (each worker is asked to stop), and SIGKILL for a worker still busy after GRACE_S
    (torch's fallback, SIGTERM, is ignored by vitlab's workers). A no-op without workers."""
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is None:
        return
    workers = list(getattr(batches, "_workers", ()))
    with signals_held():
        deadline = threading.Timer(GRACE_S, _kill, (workers,))
        deadline.daemon = True
        deadline.start()
        try:
            shutdown()
        finally:
            deadline.cancel()
            _kill(workers)
    _STARTED.discard(batches)


def end_workers() -> None:
    """Every loader this process started, closed, and any worker left ended: at the end of every
    command (vitlab.cli.main, whatever the way out) and at exit. Registered with atexit after
    multiprocessing's hook (imported with torch), so it runs before it."""
    with signals_held(replay=False):
        for batches in list(_STARTED):
            close(batches)
        _kill(_WORKERS)
        _WORKERS.clear()


atexit.register(end_workers)


def make_loader(dataset: Any, batch_size: int, *, seed: int = 0, rank: int = 0, world: int = 1, train: bool = True,
                start_step: int = 0, num_steps: Optional[int] = None, num_workers: int = 0, pin_memory: bool = False) -> Loader:
    """A DataLoader (`Loader`) of (images, labels, skipped) batches of one process (skipped: the names of
    the unreadable items dropped from the batch): for training, the
    global steps [start_step, start_step + num_steps) (default: to the end of that epoch);
    for evaluation, one pass over this process's share.

    It gets its own torch.Generator: a DataLoader otherwise draws its worker seed from the
    global generator, which would shift dropout and Mixup after a resume. pin_memory: batches
    in page-locked memory (for a CUDA device: the copy to it can overlap the step).
    """
    common: dict[str, Any] = dict(num_workers=num_workers, generator=torch.Generator().manual_seed(seed), pin_memory=pin_memory)
    if isinstance(dataset, WebDataset):
        batches = dataset.batches(batch_size=batch_size, rank=rank, world=world, start_step=start_step, num_steps=num_steps, train=train)
        return Loader(batches, batch_size=None, **common)
    sampler = EpochBatchSampler(len(dataset), batch_size, seed, rank, world, start_step, num_steps, train)
    return Loader(dataset, batch_sampler=sampler, collate_fn=collate, **common)


def known_length(dataset: Any) -> Optional[int]:
    """The number of items of a dataset, when it knows it (a stream may not)."""
    try:
        return len(dataset)
    except TypeError:
        return None


def batches_per_epoch(dataset: Any, global_batch: int) -> int:
    """Full global batches in one epoch (training drops the incomplete last one)."""
    return len(dataset) // global_batch
