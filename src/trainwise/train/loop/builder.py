"""The Trainer's parts, made once from the config, the model and the data: `build_parts` is the one way they are
made (`Trainer(...)` calls it; launch/ calls it, then adds the callbacks it makes from the parts).

The order matters: the ranks decide the device, the device the precision and the model's wrapping, the wrapped
model the step, the step's micro-batch the sampler and the loader; the checkpointer is built from what it saves,
and the engine's own callbacks are given at construction what they read besides the callbacks' view.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from trainwise.config import RunConfig, accumulation_steps
from trainwise.data.bundle import DataSpec
from trainwise.data.loader import batch_bytes, build_loader, choose_loader_settings
from trainwise.rundir.layout import RunDir
from trainwise.runtime.device import resolve_device
from trainwise.runtime.precision import enable_tf32, resolve_precision
from trainwise.train.callbacks.base import Callback
from trainwise.train.callbacks.defaults import default_callbacks
from trainwise.train.callbacks.early_stop import EarlyStopping
from trainwise.train.callbacks.token_rates import TokenFigures
from trainwise.train.loop.cadence import Cadence
from trainwise.train.loop.run_task import RunTask, planned_steps, run_task
from trainwise.train.parallel.distributed import FollowerRunDir, Ranks, init_distributed, resolve_strategy, wrap_model
from trainwise.train.parallel.sampler import ResumableBatchSampler, seeded_by_position
from trainwise.train.recovery.checkpoint import Checkpointer
from trainwise.train.recovery.oom import OomGuard
from trainwise.train.step.master_weights import computing_precision, record_lost_updates, watch_lost_updates
from trainwise.train.step.schedule import build_scheduler
from trainwise.train.step.state import TrainState
from trainwise.train.step.train_step import LossFn, TrainStep, default_loss


@dataclass(frozen=True)
class Placement:
    """Where and how this process computes: its rank in the job, the strategy, device and precision."""

    ranks: Ranks
    strategy: str
    device: torch.device
    precision: str
    tf32: bool

    def facts(self) -> dict[str, Any]:
        """As the `started` event records them."""
        return {"device": str(self.device), "tf32": self.tf32, "precision": self.precision,
                "strategy": self.strategy, "ranks": self.ranks.world_size}


@dataclass
class TrainerParts:
    """Everything the loop runs, built once; the Trainer holds them, a callback sees none but its view."""

    config: RunConfig
    task: RunTask
    run_dir: RunDir
    placement: Placement
    model: nn.Module
    forward: Callable[..., Any]
    """The model as the step calls it: wrapped for the strategy, compiled when model.compile."""
    loss_fn: LossFn
    train_step: TrainStep
    oom_guard: OomGuard
    token_figures: TokenFigures
    early_stopping: EarlyStopping
    state: TrainState
    steps_per_epoch: int
    max_steps: int
    cadence: Cadence
    sampler: ResumableBatchSampler
    loader: Any
    checkpointer: Checkpointer
    callbacks: list[Callback]
    """The engine's own (the main rank's): progress, live diagnosis, the validation guard, TensorBoard, telemetry."""
    train_data: Dataset
    val_data: Dataset | None


def build_parts(model: nn.Module, train_data: Dataset, val_data: Dataset | None = None, *, config: RunConfig,
                run_dir: RunDir | None = None, loss_fn: LossFn | None = None, data_spec: DataSpec | None = None,
                augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
                built_from_config: bool = False) -> TrainerParts:
    """The parts of a run of `model` on `train_data` (validated on `val_data`) as `config` describes it. `run_dir`:
    a new one under runs/ when not given. `built_from_config`: the model and data are the config's (launch/), not a
    Python caller's own (train/loop/python_run.py records those)."""
    task = run_task(model, train_data, val_data, config, data_spec, built_from_config)
    config = task.config
    placement, model, forward, no_sync = _place(model, config)
    run_dir = run_dir or RunDir.create(Path("runs") / time.strftime("run-%Y%m%d-%H%M%S"))
    if not placement.ranks.is_main:
        run_dir = FollowerRunDir(run_dir.path)
    config.train.refuse_unresolved_auto()
    # unset: the global batch split over the ranks (config decides, and refuses what cannot work)
    state = TrainState(micro_batch_size=config.train.micro_batch_for(placement.ranks.world_size))
    max_steps = planned_steps(model, config, len(train_data))  # type: ignore[arg-type]
    loss_fn = loss_fn or default_loss(task.data_spec.task, config.train.label_smoothing)
    train_step = TrainStep.from_config(model, config, task=task.data_spec.task, device=placement.device,
                                       precision=placement.precision, loss_fn=loss_fn, forward=forward,
                                       no_sync=no_sync, augment=augment)
    watch_lost_updates(train_step.optimizer, model, config.model, record_lost_updates(run_dir))
    train_step.scheduler = build_scheduler(train_step.optimizer, config.schedule, max_steps)
    # runs each step so that running out of memory is recoverable, on every rank alike (recovery/oom.py)
    oom_guard = OomGuard(train_step, state, run_dir, placement.ranks, batch_size=config.train.batch_size,
                         ddp=placement.strategy == "ddp", recover=config.train.oom_policy == "recover")
    es = config.eval.early_stopping
    early_stopping = EarlyStopping(config.eval.monitor_mode, es.patience, es.min_delta, enabled=es.enabled)
    checkpointer = Checkpointer(run_dir, config, model=model, optimizer=train_step.optimizer,
                                scheduler=train_step.scheduler, scaler=train_step.scaler,
                                early_stopping=early_stopping, state=state, ranks=placement.ranks,
                                sharded=config.train.sharded_checkpoints)
    steps_per_epoch = config.train.steps_per_epoch(len(train_data))  # type: ignore[arg-type]
    sampler, loader = _data(train_data, config, placement, state, steps_per_epoch)
    return TrainerParts(
        config=config, task=task, run_dir=run_dir, placement=placement, model=model, forward=forward,
        loss_fn=loss_fn, train_step=train_step, oom_guard=oom_guard, token_figures=TokenFigures(model),
        early_stopping=early_stopping, state=state, steps_per_epoch=steps_per_epoch, max_steps=max_steps,
        cadence=Cadence.from_config(config, max_steps=max_steps, has_validation=val_data is not None),
        sampler=sampler, loader=loader, checkpointer=checkpointer, train_data=train_data, val_data=val_data,
        callbacks=default_callbacks(config, placement.precision, task.profile) if placement.ranks.is_main else [])


def _place(model: nn.Module, config: RunConfig) -> tuple[Placement, nn.Module, Callable[..., Any], Any]:
    """One process, or one rank of a torchrun job: its device, precision and the model placed and wrapped for
    the strategy (DDP, FSDP2). Returns the placement, the placed model, the forward the step calls and DDP's
    no_sync."""
    train = config.train
    ranks = init_distributed(train.dist_timeout_s, sharded=train.strategy in ("ddp", "fsdp"))
    strategy = resolve_strategy(train.strategy, ranks)
    device = resolve_device(train.device, ranks.local_rank if ranks.enabled else None)
    precision = computing_precision(resolve_precision(train.precision, device), config.model)
    placement = Placement(ranks, strategy, device, precision, enable_tf32(device, train.tf32))
    model = model.to(device)
    forward, no_sync = wrap_model(model, strategy, device=device, precision=precision,
                                  cpu_offload=train.fsdp_cpu_offload, loss_chunk=config.model.loss_chunk_size)
    if config.model.compile:
        forward = torch.compile(forward)
    return placement, model, forward, no_sync


def _data(data: Dataset, config: RunConfig, placement: Placement, state: TrainState,
          steps_per_epoch: int) -> tuple[ResumableBatchSampler, Any]:
    """The sampler (resumable at any position) and the loader over the training data."""
    ranks, micro_batch = placement.ranks, state.micro_batch_size
    accumulation = accumulation_steps(config.train.batch_size, micro_batch, ranks.world_size)
    sampler = ResumableBatchSampler(len(data), micro_batch, steps_per_epoch * accumulation,  # type: ignore[arg-type]
                                    seed=config.seed, rank=ranks.rank, world_size=ranks.world_size)
    settings = choose_loader_settings(placement.device, config.data.num_workers, config.data.pin_memory,
                                      batch_bytes=batch_bytes(data, micro_batch))
    # worker processes reseed their RNGs per batch from (seed, epoch, position): random transforms
    # in a Dataset resume exactly; in-process loading shares the checkpointed global RNG instead
    fetched = seeded_by_position(data) if settings.num_workers > 0 else data
    return sampler, build_loader(fetched, sampler, settings, generator=torch.Generator().manual_seed(config.seed))
