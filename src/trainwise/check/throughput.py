"""What the model consumes: samples/s of a recipe's forward + backward + optimizer step on a batch already on
the device, and `trainwise data bench`, which sets the loader's rates (data/bench.py) against it.

The rate lives above the engine because it runs the engine's pieces (optimizer, precision, device); the data
room only receives it as a function.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from trainwise.config import RunConfig
from trainwise.data.bench import BenchResult, bench, default_recipe
from trainwise.data.bundle import DataSpec
from trainwise.data.shards import read_manifest
from trainwise.runtime.device import resolve_device
from trainwise.runtime.precision import resolve_precision
from trainwise.train.step.train_step import TrainStep


def model_rate(config: RunConfig, spec: DataSpec, batch: tuple[torch.Tensor, torch.Tensor], *,
               device: torch.device, steps: int = 8, warmup: int = 2) -> float:
    """Samples/s of the Trainer's own step (train/step/train_step.py: the recipe's optimizer, loss, precision, scaler and
    clipping) on one real batch of the training data, already on `device`."""
    from trainwise.recipes.factories import build_model

    precision = resolve_precision(config.train.precision, device)  # bf16 on a recent GPU, as in training
    model = build_model(config, spec).to(device)
    train_step = TrainStep.from_config(model, config, task=spec.task, device=device, precision=precision)
    inputs, targets = (t.to(device) for t in batch)
    batch_size = len(inputs)

    def step() -> None:
        train_step([(inputs, targets)])

    for _ in range(warmup):  # allocator, cuDNN autotune
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return steps * batch_size / (time.perf_counter() - started)


def bench_prepared(directory: str | Path, *, recipe: str | None = None, workers: list[int | str] | None = None,
                   batch_size: int | None = None, split: str = "train", seconds: float = 2.0,
                   device: str | None = None, overrides: list[str] | None = None,
                   quick: bool = False) -> BenchResult:
    """`trainwise data bench`: the loader at each worker count against the recipe's model, and the verdict."""
    from trainwise.recipes import load_recipe

    from trainwise.recipes.factories import build_data

    recipe = recipe or default_recipe(directory)
    config = load_recipe(recipe, [f"data.path={directory}", *(overrides or [])])
    torch_device = resolve_device(device or config.train.device)
    built = None
    if read_manifest(directory)["kind"] == "interactions":  # the recipe makes its samples from the log
        bundle = build_data(config)
        built = (bundle.train, bundle.spec)
    return bench(directory, config, lambda spec, batch: model_rate(config, spec, batch, device=torch_device,
                                                                   steps=1 if quick else 8,
                                                                   warmup=1 if quick else 2),
                 recipe=recipe, device=torch_device, workers=workers, batch_size=batch_size, split=split,
                 seconds=seconds, data=built)
