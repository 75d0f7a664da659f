"""Batches for training and evaluation, laid out so that resume and many processes are exact.

An epoch's order is a permutation drawn from (seed, epoch) alone -- no generator state to
carry. Global batch j is positions [j*G, (j+1)*G) of that order (G = the global batch);
process r of W takes the contiguous part [j*G + r*b, j*G + (r+1)*b), b = G / W. So W
processes together see exactly the batches one process would, and a resumed run starts at
batch j by arithmetic. Each item comes with its own augmentation seed (see
`datasets.item_seed`), so which worker or process decodes it does not matter.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import torch

from vitlab.data.datasets import item_seed


class EpochBatchSampler(torch.utils.data.Sampler):
    """Lists of (index, augmentation seed) for one process and one epoch."""

    def __init__(
        self,
        n: int,
        batch_size: int,
        epoch: int = 0,
        seed: int = 0,
        rank: int = 0,
        world: int = 1,
        start_batch: int = 0,
        train: bool = True,
    ):
        self.n, self.b, self.epoch, self.seed = n, batch_size, epoch, seed
        self.rank, self.world, self.start, self.train = rank, world, start_batch, train

    def order(self) -> torch.Tensor:
        if not self.train:
            return torch.arange(self.n)
        g = torch.Generator().manual_seed(item_seed(self.seed, self.epoch, "order"))
        return torch.randperm(self.n, generator=g)

    def __len__(self) -> int:
        if self.train:
            return self.n // (self.b * self.world) - self.start
        mine = (self.n - self.rank + self.world - 1) // self.world
        return max((mine + self.b - 1) // self.b - self.start, 0)

    def __iter__(self) -> Iterator[list[tuple[int, Optional[int]]]]:
        order = self.order().tolist()
        g = self.b * self.world
        for j in range(self.start, self.start + len(self)):
            if self.train:
                part = order[j * g + self.rank * self.b : j * g + (self.rank + 1) * self.b]
                yield [(i, item_seed(self.seed, self.epoch, i)) for i in part]
            else:
                mine = order[self.rank :: self.world]
                yield [(i, None) for i in mine[j * self.b : (j + 1) * self.b]]


def collate(items: list) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Stack (image, label) pairs; unreadable items (None, with --skip-bad-images) are dropped
    and counted in the third element."""
    good = [x for x in items if x is not None]
    bad = len(items) - len(good)
    if not good:
        return torch.empty(0), torch.empty(0, dtype=torch.long), bad
    return torch.stack([x for x, _ in good]), torch.tensor([y for _, y in good], dtype=torch.long), bad


def make_loader(
    dataset: Any,
    batch_size: int,
    *,
    epoch: int = 0,
    seed: int = 0,
    rank: int = 0,
    world: int = 1,
    start_batch: int = 0,
    train: bool = True,
    num_workers: int = 0,
) -> torch.utils.data.DataLoader:
    """A DataLoader of (images, labels, bad_count) batches for one process and one epoch.

    It gets its own torch.Generator: a DataLoader otherwise draws its worker seed from the
    global generator, which would shift dropout and Mixup after a resume.
    """
    from vitlab.data.wds import WebDataset

    common = dict(num_workers=num_workers, generator=torch.Generator().manual_seed(seed), persistent_workers=False)
    if isinstance(dataset, WebDataset):
        batches = dataset.batches(
            batch_size=batch_size, epoch=epoch, rank=rank, world=world, start_batch=start_batch, train=train
        )
        return torch.utils.data.DataLoader(batches, batch_size=None, **common)
    sampler = EpochBatchSampler(len(dataset), batch_size, epoch, seed, rank, world, start_batch, train)
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, **common)


def batches_per_epoch(dataset: Any, global_batch: int) -> int:
    """Full global batches in one epoch (training drops the incomplete last one)."""
    return len(dataset) // global_batch
