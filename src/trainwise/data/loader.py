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

import math
import os
import shutil
from collections import deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from trainwise.errors import ConfigError

MAX_AUTO_WORKERS = 8  # past this, per-sample loaders rarely get faster; prepared data needs far fewer
WORKERS_PER_CORE = 2  # an explicit count may oversubscribe a little (workers wait on disk), not more
PREFETCH_FACTOR = 4  # batches each worker keeps ready
# What `auto` assumes a batch weighs when the caller does not say: a batch of 32 224² RGB float images
# is 19 MB. Each worker's ready batches sit in /dev/shm, which is where small container defaults break.
ASSUMED_BATCH_BYTES = 16 * 2**20
WORKER_RAM_BYTES = 256 * 2**20  # a forked worker's own memory: pages refcounting un-shares, its batches


@dataclass(frozen=True)
class LoaderSettings:
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    automatic: bool = False
    """Workers were chosen by `auto`: a dataset that reads in place is then read by threads instead."""


def usable_cores() -> int:
    """Cores this process may run on: the product's one count of them (loader, doctor, plan, ablate, prepare).

    The CPU affinity (taskset, a cpuset) capped by a container's CPU quota (`docker run --cpus`), which
    leaves the affinity at every core of the host."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    return max(1, min(cores, quota)) if quota else cores


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Whole cores the cgroup's CPU quota allows (rounded up), or None without a quota (v2 or v1)."""
    try:
        if (root / "cpu.max").is_file():
            quota, period = (root / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else math.ceil(int(quota) / int(period))
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return math.ceil(quota_us / period_us) if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def auto_workers(cores: int, gpus: int = 1, *, ram_available_bytes: int | None = None,
                 shm_free_bytes: int | None = None, batch_bytes: int = ASSUMED_BATCH_BYTES,
                 prefetch_factor: int = PREFETCH_FACTOR) -> int:
    """Loader workers per training process (one per GPU): the free cores (one stays with training), at most
    `MAX_AUTO_WORKERS`, and no more than half the free RAM and half the free /dev/shm carry, shared between
    the processes. Memory facts left None are not limits."""
    processes = max(gpus, 1)
    limits = [MAX_AUTO_WORKERS, cores // processes - 1]
    if ram_available_bytes is not None:
        limits.append(ram_available_bytes // 2 // processes // WORKER_RAM_BYTES)
    if shm_free_bytes is not None:  # each worker's ready batches wait in /dev/shm for the training process
        limits.append(shm_free_bytes // 2 // processes // max(1, prefetch_factor * batch_bytes))
    return max(0, min(limits))


def max_workers(cores: int) -> int:
    """The most loader workers a process with `cores` usable cores may start."""
    return max(1, cores) * WORKERS_PER_CORE


def choose_loader_settings(device: torch.device, num_workers: int | str = "auto",
                           pin_memory: bool | str = "auto", *, gpus: int = 1,
                           batch_bytes: int = ASSUMED_BATCH_BYTES) -> LoaderSettings:
    """Workers sized from this machine for `auto`, or the count asked for within `max_workers`; pinned memory
    for CUDA. A count the machine cannot carry is a ConfigError, before any worker is forked."""
    cores = usable_cores()
    automatic = num_workers == "auto"
    if automatic:
        ram, shm = _free_memory()
        workers = auto_workers(cores, gpus, ram_available_bytes=ram, shm_free_bytes=shm, batch_bytes=batch_bytes)
    else:
        workers = _checked_workers(num_workers, cores)
    pin = device.type == "cuda" if pin_memory == "auto" else bool(pin_memory)
    return LoaderSettings(workers, pin, persistent_workers=workers > 0,
                          prefetch_factor=PREFETCH_FACTOR if workers > 0 else None, automatic=automatic)


def _checked_workers(num_workers: int | str, cores: int) -> int:
    bound = max_workers(cores)
    if isinstance(num_workers, str) and num_workers.isdigit():  # "4" from a command line
        num_workers = int(num_workers)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ConfigError(f"data.num_workers={num_workers!r}: give auto, 0 (load in the training process) or a "
                          f"count of worker processes up to {bound}.")
    if num_workers > bound:
        raise ConfigError(f"data.num_workers={num_workers}: this process may use {cores} cores, so at most {bound} "
                          f"loader workers ({WORKERS_PER_CORE} per core); more only fork processes that fight over "
                          f"the cores and memory. Set data.num_workers=auto or a count up to {bound}.")
    return num_workers


def _free_memory() -> tuple[int | None, int | None]:
    """(available RAM, free /dev/shm) in bytes; None for what this system does not report."""
    try:
        import psutil

        ram = int(psutil.virtual_memory().available)
    except (ImportError, OSError):
        ram = None
    try:
        shm = int(shutil.disk_usage("/dev/shm").free)
    except OSError:  # no /dev/shm (macOS, Windows): workers share memory another way
        shm = None
    return ram, shm


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


def release_workers(loader: Iterable) -> None:
    """Stop a DataLoader's persistent worker processes now. Left to the garbage collector (a trainer is
    freed with its reference cycles), the workers missed their stop message and were joined only after
    torch's 5 s timeout each: a 10 s stall at some later collection. The next `iter(loader)` starts fresh
    workers. `_shutdown_workers` is torch's own shutdown, the one its finaliser calls; there is no public
    handle."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and callable(getattr(iterator, "_shutdown_workers", None)):
        iterator._shutdown_workers()
        loader._iterator = None  # type: ignore[attr-defined]


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
            batch = ({key: tensor.pin_memory() for key, tensor in batch.items()} if isinstance(batch, dict)
                     else tuple(tensor.pin_memory() for tensor in batch))
        return batch


def batch_bytes(dataset: Dataset, micro_batch_size: int) -> int:
    """Bytes of one micro-batch, from the first sample: what `auto` workers must fit in /dev/shm."""
    try:
        sample = dataset[0]
    except Exception:  # a dataset that cannot be read here says so clearly when the loader reads it
        return ASSUMED_BATCH_BYTES
    parts = (tuple(sample.values()) if isinstance(sample, dict)  # a token batch (data/text/packing.py)
             else sample if isinstance(sample, (tuple, list)) else (sample,))
    sample_bytes = sum(t.nbytes for t in parts if isinstance(t, torch.Tensor))
    return max(sample_bytes * micro_batch_size, 1)
