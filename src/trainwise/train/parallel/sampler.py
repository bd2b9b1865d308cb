"""The data order: a seeded permutation per epoch, cut into micro-batches, that can start at any batch.

Resuming at batch k of epoch e regenerates epoch e's permutation and starts at k: nothing is replayed or
skipped, and the cost does not grow with the position.

Randomness inside a Dataset (random crops, noise) drawn in DataLoader worker processes is made a function
of the position too: each micro-batch carries a seed derived from (seed, epoch, position), and the worker
reseeds torch, numpy and random from it before fetching. Which worker fetches a batch, and whether the
run was resumed, then no longer matters.
"""
from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info


class SeededBatch(list):
    """A micro-batch's sample indices, with the seed its fetch must use (pickles to workers with it)."""

    seed: int = 0


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

    def set_position(self, epoch: int, batch: int, *, micro_batch_size: int | None = None,
                     batches_per_epoch: int | None = None) -> None:
        """Where the next iteration starts: micro-batch `batch` of `epoch`; and, when given, how it is cut from
        there (the Trainer passes its TrainState's micro-batch each time it starts iterating, so a size
        changed by an out-of-memory recovery is read from the one place it is kept)."""
        self.epoch, self.start_batch = epoch, batch
        if micro_batch_size is not None:
            self.micro_batch_size = micro_batch_size
        if batches_per_epoch is not None:
            self.batches_per_epoch = batches_per_epoch

    def order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.num_samples)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order(self.epoch).tolist()  # once per epoch, not per batch
        size = self.micro_batch_size
        for batch in range(self.start_batch, self.batches_per_epoch):
            position = batch * self.world_size + self.rank
            indices = SeededBatch(order[position * size:(position + 1) * size])
            indices.seed = batch_seed(self.seed, self.epoch, position)
            yield indices

    def __len__(self) -> int:
        return self.batches_per_epoch - self.start_batch


def batch_seed(seed: int, epoch: int, position: int) -> int:
    """A 63-bit seed per (run seed, epoch, micro-batch position), well mixed by numpy's SeedSequence."""
    words = np.random.SeedSequence([seed, epoch, position]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


class PositionSeededDataset(Dataset):
    """Wraps a dataset so that, in a DataLoader worker, each batch is fetched with its position's seed."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self.batched = getattr(dataset, "batched", False)
        self.reads_in_place = getattr(dataset, "reads_in_place", False)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index):
        return self.dataset[index]

    def __getitems__(self, indices: list[int]):
        seed = getattr(indices, "seed", None)
        if seed is not None and get_worker_info() is not None:  # never reseed the training process
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % 2**32)
        fetch_many = getattr(self.dataset, "__getitems__", None)
        if fetch_many is not None:
            return fetch_many(list(indices))
        return [self.dataset[i] for i in indices]


def seeded_by_position(dataset: Dataset) -> Dataset:
    return PositionSeededDataset(dataset)
