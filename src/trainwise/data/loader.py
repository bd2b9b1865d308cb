"""Turn a dataset into a DataLoader whose settings suit the machine it runs on.

Two ways to load, chosen by what the data costs to read:
- datasets that decode per sample (files, user datasets): worker processes (`num_workers`), as usual;
- prepared datasets (memory-mapped shards, one fancy-index per shard per batch): reading a batch costs
  less than shipping it from a worker process through shared memory (benchmarks/data_throughput.py
  measures both), so with `num_workers: auto` they are read in the training process by a pool of
  threads, as many as auto would start processes, a few batches ahead; the numpy copies and the uint8 →
  float conversion release the GIL, so the threads run in parallel.
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


@dataclass(frozen=True)
class LoaderSettings:
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    automatic: bool = False
    """Workers were chosen by `auto`: a dataset that reads in place is then read by threads instead."""


def usable_cores() -> int:
    """Cores this process may run on (a container or taskset may allow fewer than the machine has)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def auto_workers(cores: int, gpus: int = 1) -> int:
    """Loader workers per training process: the free cores (one stays with training), at most 8."""
    return max(0, min(8, cores // max(gpus, 1) - 1))


def choose_loader_settings(device: torch.device, num_workers: int | str = "auto",
                           pin_memory: bool | str = "auto", *, gpus: int = 1) -> LoaderSettings:
    """Workers from free cores (one core stays with the training process), pinned memory for CUDA."""
    automatic = num_workers == "auto"
    if automatic:
        num_workers = auto_workers(usable_cores(), gpus)
    workers = int(num_workers)
    pin = device.type == "cuda" if pin_memory == "auto" else bool(pin_memory)
    return LoaderSettings(workers, pin, persistent_workers=workers > 0,
                          prefetch_factor=4 if workers > 0 else None, automatic=automatic)


def _pass_through(batch):
    return batch


def build_loader(dataset: Dataset, batch_sampler: Sampler, settings: LoaderSettings,
                 generator: torch.Generator | None = None) -> DataLoader:
    """A loader over `batch_sampler`; datasets that fetch whole batches skip per-sample collation."""
    batched = getattr(dataset, "batched", False)
    if settings.automatic and batched and getattr(dataset, "reads_in_place", False):
        threads = max(1, settings.num_workers)
        return PrefetchingLoader(dataset, batch_sampler, threads=threads,  # type: ignore[return-value]
                                 depth=2 * threads + 1, pin_memory=settings.pin_memory)
    return DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=settings.num_workers,
        pin_memory=settings.pin_memory,
        persistent_workers=settings.persistent_workers,
        prefetch_factor=settings.prefetch_factor,
        collate_fn=_pass_through if batched else None,
        generator=generator,  # worker seeds come from here, never from the global RNG
    )


class PrefetchingLoader:
    """Batches of a batched dataset, fetched by `threads` threads up to `depth` batches ahead, in order.

    Iterates like a DataLoader (and has its `len`, `dataset`, `batch_sampler`); an iteration abandoned
    midway cancels what it had queued.
    """

    def __init__(self, dataset: Dataset, batch_sampler, *, threads: int, depth: int, pin_memory: bool):
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.threads = threads
        self.depth = max(depth, threads)
        self.pin_memory = pin_memory

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self):
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="trainwise-loader")
        pending: deque = deque()
        try:
            for indices in self.batch_sampler:
                pending.append(pool.submit(self._fetch, indices))
                if len(pending) >= self.depth:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _fetch(self, indices):
        batch = self.dataset.__getitems__(indices)  # type: ignore[attr-defined]
        if self.pin_memory:  # pinned here, on the loading thread, so the copy to the GPU can be async
            batch = tuple(tensor.pin_memory() for tensor in batch)
        return batch
