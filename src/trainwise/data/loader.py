"""Turn a dataset into a DataLoader whose settings suit the machine it runs on."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


@dataclass(frozen=True)
class LoaderSettings:
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None


def choose_loader_settings(device: torch.device, num_workers: int | str = "auto",
                           pin_memory: bool | str = "auto", *, gpus: int = 1) -> LoaderSettings:
    """Workers from free cores (one core stays with the training process), pinned memory for CUDA."""
    if num_workers == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        num_workers = max(0, min(8, cores // max(gpus, 1) - 1))
    workers = int(num_workers)
    pin = device.type == "cuda" if pin_memory == "auto" else bool(pin_memory)
    return LoaderSettings(workers, pin, persistent_workers=workers > 0,
                          prefetch_factor=4 if workers > 0 else None)


def _pass_through(batch):
    return batch


def build_loader(dataset: Dataset, batch_sampler: Sampler, settings: LoaderSettings,
                 generator: torch.Generator | None = None) -> DataLoader:
    """A loader over `batch_sampler`; datasets that fetch whole batches skip per-sample collation."""
    batched = getattr(dataset, "batched", False)
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
