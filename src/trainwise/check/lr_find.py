"""`trainwise lr-find`: the learning-rate range test (Smith 2017, "Cyclical Learning Rates for Training
Neural Networks", §3.3; popularised by fastai's `lr_find`).

Train a copy of the model for a short sweep, raising the learning rate exponentially each step from
`min_lr` to `max_lr`; record the loss at each step, smooth it (an exponential moving average, corrected
for its zero start), and stop once the smoothed loss passes `DIVERGENCE_FACTOR` × its best: past that
point the curve says nothing more. The curve's rules and the suggestion are pure and live in
trainwise.diagnose.lr_curve, which the report reads too.

The step is the engine's own (train/step/train_step.py's TrainStep.from_config: the Trainer's optimizer, loss, scaler
and clipping), so what the sweep measures is what `trainwise train` would run. The losses stay on the
device and are read every `READ_EVERY` steps, to check for divergence, not once per step.

Nothing here writes to a run directory: `write_outputs` writes `lr_find.json` and `lr_find.png` into the
directory the user named, each atomically, both rendered in memory first.
"""
from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from trainwise.rundir.atomic import atomic_write_bytes, atomic_write_json, is_disk_full
from trainwise.config import RunConfig
from trainwise.data.loader import LoaderSettings, build_loader
from trainwise.diagnose.lr_curve import (READ_EVERY, LrFindResult, SweepSettings, curve_note, default_steps,
                                        divergence_index, finite_json, lr_at, render_png, smooth, suggest_lr)
from trainwise.errors import ConfigError, DataError, RunDirError, TrainingError
from trainwise.rundir.layout import RunDir
from trainwise.runtime.device import resolve_device
from trainwise.runtime.precision import resolve_precision
from trainwise.data.batch import MicroBatch
from trainwise.train.step.train_step import TrainStep

KNOWN_LOSSES = ("classification", "regression")  # the tasks default_loss knows

# ---- the sweep --------------------------------------------------------------------------------------

def check_has_loss(task: str, model: nn.Module) -> None:
    """A loss to minimise and parameters it moves: without both there is no curve to read."""
    if task not in KNOWN_LOSSES:
        raise ConfigError(f"lr-find needs a loss to minimise: this recipe's data has task {task!r}, which "
                          f"has no built-in loss ({' or '.join(KNOWN_LOSSES)}). Nothing was written.")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError("lr-find: the model has no trainable parameters, so no learning rate changes its "
                          "loss. Nothing was written.")


def sweep(model: nn.Module, train_data: Dataset, *, config: RunConfig, task: str = "classification",
          augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
          settings: SweepSettings = SweepSettings()) -> LrFindResult:
    """The range test on a deep copy of `model` (the caller's weights are never touched)."""
    settings.check()
    check_has_loss(task, model)
    train = config.train
    micro_batch_size = train.micro_batch
    accumulation_steps = train.accumulation_steps
    samples = len(train_data)  # type: ignore[arg-type]
    batches_per_epoch = samples // micro_batch_size
    if batches_per_epoch < accumulation_steps:
        raise DataError(f"lr-find: the training split has {samples} samples, fewer than one batch "
                        f"({train.batch_size}); lower train.batch_size.")
    steps = settings.steps or default_steps(batches_per_epoch // accumulation_steps)

    device = resolve_device(train.device)
    precision = resolve_precision(train.precision, device)
    probe = copy.deepcopy(model).to(device).train()
    step = TrainStep.from_config(probe, config, task=task, device=device, precision=precision,
                                 augment=augment)  # no scheduler: the sweep sets lr
    optimizer = step.optimizer

    lrs: list[float] = []
    losses: list[float] = []
    pending: list[torch.Tensor] = []
    diverged_at = None
    batches = _batches(train_data, micro_batch_size, accumulation_steps, config.seed)
    for index in range(steps):
        lr = lr_at(index, steps, settings.min_lr, settings.max_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        lrs.append(lr)
        pending.append(step(next(batches)).loss)
        if len(pending) == READ_EVERY or index == steps - 1:
            losses += torch.stack(pending).float().cpu().tolist()  # one transfer per READ_EVERY steps
            pending = []
            diverged_at = divergence_index(smooth(losses, settings.smoothing), settings.divergence_factor)
            if diverged_at is not None:
                break
    smoothed = smooth(losses, settings.smoothing)
    if diverged_at is not None:  # keep the first diverged point: it shows where the curve turns
        lrs, losses, smoothed = lrs[:diverged_at + 1], losses[:diverged_at + 1], smoothed[:diverged_at + 1]
    if not math.isfinite(smoothed[0]):
        raise TrainingError(f"lr-find: the loss is not finite from the first step (at lr {settings.min_lr:g}); "
                            "check the data for NaN/Inf and the model's output. Nothing was written.")
    suggestion = suggest_lr(lrs, smoothed)
    return LrFindResult(lrs=lrs, losses=losses, smoothed=smoothed, suggestion=suggestion, steps_planned=steps,
                        diverged=diverged_at is not None, settings=settings,
                        context={"optimizer": config.optim.name, "batch_size": train.batch_size,
                                 "precision": precision, "device": str(device)},
                        note=curve_note(lrs, smoothed, suggestion, diverged_at is not None, settings))


def _batches(dataset: Dataset, micro_batch_size: int, accumulation_steps: int,
             seed: int) -> Iterator[list[MicroBatch]]:
    """Groups of `accumulation_steps` full micro-batches, reshuffled each epoch with its own generator (the
    global RNG stays the model's and the augmentation's)."""
    generator = torch.Generator().manual_seed(seed)
    n = len(dataset)  # type: ignore[arg-type]
    settings = LoaderSettings(0, False, False, None)  # in-process: a probe of ~100 steps
    while True:
        order = torch.randperm(n, generator=generator).tolist()
        indices = [order[i:i + micro_batch_size] for i in range(0, n - micro_batch_size + 1, micro_batch_size)]
        group: list[MicroBatch] = []
        for micro_batch in build_loader(dataset, indices, settings):  # type: ignore[arg-type]
            group.append(micro_batch)
            if len(group) == accumulation_steps:
                yield group
                group = []


def lr_find_config(config: RunConfig, settings: SweepSettings = SweepSettings()) -> LrFindResult:
    """The range test of a recipe: data and model built as `trainwise train` builds them (same seed, so the
    sweep starts from the weights the run would start from)."""
    from trainwise.data.bundle import check_labels
    from trainwise.recipes.factories import build_data, build_model
    from trainwise.runtime.seed import seed_everything

    settings.check()
    seed_everything(config.seed)
    bundle = build_data(config)
    check_labels(bundle)
    model = build_model(config, bundle.spec)
    return sweep(model, bundle.train, config=config, task=bundle.spec.task, augment=bundle.augment,
                 settings=settings)


# ---- outputs --------------------------------------------------------------------------------------

def refuse_out_dir(out: Path, *, overwrite: bool, config: RunConfig | None = None) -> None:
    """Before any work: `out` must be a new or empty directory, or a run directory without an LR range test
    yet (its report then shows the test), unless the user said --overwrite; and a run directory only of the
    same model and data as `config` (another recipe's report would show this test as its own)."""
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {out} exists and is not a directory; choose another --out.")
    if config is not None and RunDir(out).config_path.is_file():
        refuse_other_run(out, config)
    ours = RunDir(out).lr_find_paths
    a_run_to_add_to = RunDir(out).config_path.is_file() and not any(p.exists() for p in ours)
    if out.is_dir() and any(out.iterdir()) and not overwrite and not a_run_to_add_to:
        raise RunDirError(f"--out {out} already holds files. Nothing was touched. Choose another --out, or pass "
                          "--overwrite to replace its lr_find.json and lr_find.png.")
    existing = next(p for p in (out.absolute(), *out.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise RunDirError(f"--out {out}: cannot write there ({existing} is not a directory you can write to). "
                          "Choose another --out.")


def refuse_other_run(out: Path, config: RunConfig) -> None:
    """RunDirError when the run in `out` trained another model or data than the range test would use."""
    from trainwise.errors import TrainwiseError

    try:
        theirs = RunDir(out).read_config()
    except TrainwiseError:
        raise RunDirError(f"--out {out} holds a config.yaml that cannot be read: nothing was touched. Choose "
                          "another --out.") from None
    mine, other = _trained_on(config), _trained_on(theirs)
    if mine != other:
        raise RunDirError(f"--out {out} is a run of {theirs.name or 'another recipe'} (model {other[0]} on "
                          f"{other[2] or other[1]}); this LR range test is of {config.name or 'another recipe'} "
                          f"(model {mine[0]} on {mine[2] or mine[1]}), and that run's report would show it as its "
                          "own. Nothing was touched. Choose another --out, or the run of this recipe.")


def _trained_on(config: RunConfig) -> tuple[str | None, str | None, str | None]:
    return config.model.factory or config.model.name, config.data.factory or config.data.name, config.data.path


def write_outputs(result: LrFindResult, out: Path) -> tuple[Path, Path]:
    """Both files rendered in memory first, then each written atomically: a failure leaves no half file."""
    png = render_png(result)
    try:
        json_target, png_target = RunDir(out).lr_find_paths
        png_path = atomic_write_bytes(png_target, png)
        json_path = atomic_write_json(json_target, finite_json(result.to_dict()))
    except OSError as error:  # e.g. a read-only disk: the user's choice of place, not a bug
        if is_disk_full(error):
            raise
        raise RunDirError(f"--out {out}: cannot write there ({error.strerror or error}). Choose another "
                          "--out.") from None
    return json_path, png_path
