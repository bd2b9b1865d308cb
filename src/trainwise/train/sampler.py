"""The data order: a seeded permutation per epoch, cut into micro-batches, that can start at any batch.

Resuming at batch k of epoch e regenerates epoch e's permutation and starts at k: nothing is replayed or
skipped, and the cost does not grow with the position.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ResumableBatchSampler(Sampler[list[int]]):
    """Yields `batches_per_epoch` micro-batches of indices; the last partial batch of an epoch is dropped.

    Under torchrun every rank draws the same permutation and takes every `world_size`-th micro-batch, so the
    ranks together see each sample of an epoch once."""

    def __init__(self, num_samples: int, micro_batch_size: int, batches_per_epoch: int, seed: int,
                 shuffle: bool = True, rank: int = 0, world_size: int = 1):
        self.rank, self.world_size = rank, world_size
        self.num_samples = num_samples
        self.micro_batch_size = micro_batch_size
        self.batches_per_epoch = batches_per_epoch
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.start_batch = 0

    def set_position(self, epoch: int, batch: int) -> None:
        """Where the next iteration starts: micro-batch `batch` of `epoch`."""
        self.epoch, self.start_batch = epoch, batch

    def order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.num_samples)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order(self.epoch)
        size = self.micro_batch_size
        for batch in range(self.start_batch, self.batches_per_epoch):
            position = batch * self.world_size + self.rank
            yield order[position * size:(position + 1) * size].tolist()

    def __len__(self) -> int:
        return self.batches_per_epoch - self.start_batch
