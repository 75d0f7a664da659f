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

import signal
from typing import Any, Iterator, Optional

import torch

from vitlab.config import STOP_SIGNALS
from vitlab.data.datasets import Skipped, item_seed
from vitlab.data.decode import stack_images
from vitlab.data.wds import WebDataset


class EpochBatchSampler(torch.utils.data.Sampler):
    """Lists of (index, augmentation seed) for one process.

    Training: the batches of global steps [start_step, start_step + num_steps), crossing
    epochs as needed (one DataLoader, and one set of workers, for the whole run).
    Evaluation: one pass, this process's share (every world-th item).
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world: int = 1,
        start_step: int = 0,
        num_steps: Optional[int] = None,
        train: bool = True,
    ):
        self.n, self.b, self.seed = n, batch_size, seed
        self.rank, self.world, self.start, self.train = rank, world, start_step, train
        self.per_epoch = n // (batch_size * world)
        self.num_steps = self.per_epoch - start_step % max(self.per_epoch, 1) if num_steps is None else num_steps

    def order(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(item_seed(self.seed, epoch, "order"))
        return torch.randperm(self.n, generator=g)

    def __len__(self) -> int:
        if self.train:
            return self.num_steps
        mine = (self.n - self.rank + self.world - 1) // self.world
        return (mine + self.b - 1) // self.b

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


def leave_signals_to_parent(worker_id: int) -> None:
    """A worker's start: the signals that stop a training run (train.stop_signals) are the main
    process's to act on. Slurm sends them to every process of a job; a worker ended by one
    would end the run before the checkpoint the main process writes at its next step. The
    main process ends its workers itself, and a worker leaves when its parent is gone. Ctrl-C
    (SIGINT, sent to the terminal's whole process group) is the main process's too."""
    for name in (*STOP_SIGNALS, "INT"):
        signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_IGN)


def make_loader(
    dataset: Any,
    batch_size: int,
    *,
    seed: int = 0,
    rank: int = 0,
    world: int = 1,
    train: bool = True,
    start_step: int = 0,
    num_steps: Optional[int] = None,
    num_workers: int = 0,
    pin_memory: bool = False,
) -> torch.utils.data.DataLoader:
    """A DataLoader of (images, labels, skipped) batches of one process (skipped: the names of
    the unreadable items dropped from the batch): for training, the
    global steps [start_step, start_step + num_steps) (default: to the end of that epoch);
    for evaluation, one pass over this process's share.

    It gets its own torch.Generator: a DataLoader otherwise draws its worker seed from the
    global generator, which would shift dropout and Mixup after a resume. pin_memory: batches
    in page-locked memory (for a CUDA device: the copy to it can overlap the step).
    """
    common: dict[str, Any] = dict(num_workers=num_workers, generator=torch.Generator().manual_seed(seed), pin_memory=pin_memory,
                  worker_init_fn=leave_signals_to_parent if num_workers else None)
    if isinstance(dataset, WebDataset):
        batches = dataset.batches(
            batch_size=batch_size, rank=rank, world=world, start_step=start_step, num_steps=num_steps, train=train
        )
        return torch.utils.data.DataLoader(batches, batch_size=None, **common)
    sampler = EpochBatchSampler(len(dataset), batch_size, seed, rank, world, start_step, num_steps, train)
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, **common)


def batches_per_epoch(dataset: Any, global_batch: int) -> int:
    """Full global batches in one epoch (training drops the incomplete last one)."""
    return len(dataset) // global_batch
