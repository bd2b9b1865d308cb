"""`trainwise data bench DIR`: can the loader keep the model fed?

Two thin probes — loader samples/s at each worker count (here), and the model's samples/s on a batch already
on the device (the engine's: trainwise.check.throughput, which also runs the whole bench for the CLI) — and
one pure decision, `bench_verdict`, over the numbers they return. Data sits below training, so the model's
rate comes in as a function.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import BatchSampler, Dataset, RandomSampler, default_collate

from trainwise.config import RunConfig
from trainwise.data.bundle import DataSpec
from trainwise.data.loader import build_loader, choose_loader_settings
from trainwise.data.prepared import PreparedDataset, data_spec
from trainwise.data.shards import read_manifest
from trainwise.errors import DataError

Batch = tuple[torch.Tensor, torch.Tensor]
ModelRate = Callable[[DataSpec, Batch], float]
"""Samples/s the model consumes, given the data's spec and one real batch of the training data: the inputs a
model is timed on have the data's shapes, dtypes and values (item ids for a recommender, not random floats)."""

HEADROOM = 1.2  # the loader should beat the model by this much: step times jitter, workers get descheduled
NOISE = 0.05  # rates this close to the best are a tie: the setting measured first (the cheaper one) wins
QUICK_SECONDS = 0.5  # per worker count in the default `--quick` bench: the whole bench stays under ~5 s
FULL_SECONDS = 2.0


@dataclass(frozen=True)
class Verdict:
    bottleneck: bool
    """True when even the best worker count delivers fewer samples/s than the model consumes."""
    workers: str
    """The `data.num_workers` value to set: the one measured fastest ("auto" or a count)."""
    message: str


def bench_verdict(loader_rates: dict[str, float], model_rate: float) -> Verdict:
    """Recommend the setting measured fastest (within `NOISE` of the best, the first measured: cheapest
    first), with the numbers, and say whether it keeps up with what the model consumes. Keys are
    `data.num_workers` values: "auto", "0", "2", ..."""
    if not loader_rates:
        raise ValueError("no loader measurements")
    top = max(loader_rates.values())
    setting = next(s for s, rate in loader_rates.items() if rate >= (1 - NOISE) * top)
    best = loader_rates[setting]
    others = [f"{s}: {rate:,.0f}" for s, rate in loader_rates.items() if s != setting]
    measured = (f"num_workers={setting} loaded the most, {best:,.0f} samples/s"
                + (f" (others: {', '.join(others)})" if others else "") + f"; the model consumes {model_rate:,.0f}")
    if best >= HEADROOM * model_rate:
        return Verdict(False, setting, f"{measured}: data will not be the bottleneck; set "
                       f"data.num_workers={setting}")
    if best >= model_rate:
        return Verdict(False, setting, f"{measured}: data keeps up, with little headroom; set "
                       f"data.num_workers={setting}")
    share = best / model_rate if model_rate else 0.0
    return Verdict(True, setting, f"{measured}: data will be the bottleneck (the GPU waits {1 - share:.0%} of the "
                   f"time); set data.num_workers={setting}, and prepare smaller images (--size) or run on a machine "
                   "with more CPU cores")


def loader_rate(dataset: Dataset, *, workers: int | str, batch_size: int, device: torch.device,
                seconds: float = 2.0, seed: int = 0) -> float:
    """Samples/s of shuffled batches through trainwise's loader, copied to `device`, after the first batch
    (worker start-up is not throughput)."""
    settings = choose_loader_settings(device, workers)
    generator = torch.Generator().manual_seed(seed)
    sampler = BatchSampler(RandomSampler(dataset, generator=generator), batch_size, drop_last=False)
    loader = build_loader(dataset, sampler, settings, generator=generator)
    samples, started = 0, None
    for _ in range(100):  # passes; a small dataset is read several times to fill the time budget
        for inputs, targets in loader:
            inputs = inputs.to(device, non_blocking=True)
            if started is None:
                started = time.perf_counter()
                continue
            samples += len(inputs)
            if time.perf_counter() - started >= seconds:
                break
        if started is not None and time.perf_counter() - started >= seconds:
            break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - (started or time.perf_counter())
    return samples / elapsed if elapsed > 0 and samples else 0.0


@dataclass
class BenchResult:
    loader: dict[str, float]
    model: float
    batch_size: int
    device: str
    recipe: str
    verdict: Verdict


def default_recipe(directory: str | Path) -> str:
    """The built-in recipe whose model sets the pace for a prepared dataset: by what the dataset holds (an
    interaction log: SASRec's, whose training samples are the windows `shop-din` also reads from)."""
    kind = read_manifest(directory)["kind"]
    return {"interactions": "shop-sasrec", "images": "image-folder"}.get(kind, "table")


def sample_batch(dataset: Dataset, size: int) -> Batch:
    """The first `size` samples of `dataset` as one batch (cycling through a smaller dataset), collated as the
    loader does."""
    indices = [i % len(dataset) for i in range(size)]
    if getattr(dataset, "batched", False):
        inputs, targets = dataset.__getitems__(indices)  # type: ignore[attr-defined]
        return torch.as_tensor(inputs), torch.as_tensor(targets)
    inputs, targets = default_collate([dataset[i] for i in indices])
    return inputs, targets


def bench(directory: str | Path, config: RunConfig, model_rate: ModelRate, *, recipe: str,
          device: torch.device, workers: list[int | str] | None = None, batch_size: int | None = None,
          split: str = "train", seconds: float = 2.0, data: tuple[Dataset, DataSpec] | None = None) -> BenchResult:
    """Measure the loader at each worker count against `model_rate` (the model `config` builds), and decide.
    `data`: the training dataset and its spec when the recipe builds them from the directory (a recommender's
    windows over an interaction log); otherwise the prepared `split` as it is stored."""
    manifest = read_manifest(directory)
    batch = batch_size or config.train.micro_batch
    dataset, spec = data or (PreparedDataset(directory, split, manifest=manifest), data_spec(manifest))
    if not len(dataset):  # type: ignore[arg-type]
        raise DataError(f"{directory}: the {split} split is empty.")
    counts = workers if workers is not None else worker_counts()
    rates = {str(w): loader_rate(dataset, workers=w, batch_size=batch, device=device, seconds=seconds)
             for w in counts}
    consumed = model_rate(spec, sample_batch(dataset, batch))
    return BenchResult(rates, consumed, batch, str(device), recipe, bench_verdict(rates, consumed))


def worker_counts(quick: bool = False) -> list[int | str]:
    """`auto` (for prepared data: a background thread, no worker processes), then 0 up to what auto would
    give a per-sample dataset; `quick`: only auto, 0 and that most."""
    most = choose_loader_settings(torch.device("cpu"), "auto").num_workers
    counts = {0, most}
    if not quick:
        counts.update(c for c in (1, 2, 4, 8) if c < most)
    return ["auto", *sorted(counts)]
