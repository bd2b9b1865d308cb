"""The training loop.

`Trainer(model, train_data, val_data, config=...).fit()` trains a plain nn.Module on plain Datasets.

The batch contract: a dataset yields `(inputs, targets)`; `model(inputs)` returns outputs; the loss is
`loss_fn(outputs, targets)` — cross-entropy (with label smoothing) for classification, MSE for regression,
or any callable you pass. `train.batch_size` samples make one optimizer step, fed as
`batch_size / micro_batch_size` micro-batches whose gradients are accumulated.
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset

from trainwise.config import RunConfig
from trainwise.data.bundle import DataSpec
from trainwise.data.loader import build_loader, choose_loader_settings
from trainwise.errors import ConfigError, DataError, TrainingError
from trainwise.run import RunDir
from trainwise.train import checkpoint as ckpt
from trainwise.train.callbacks import Callback, CallbackList
from trainwise.train.device import resolve_device
from trainwise.train.distributed import FollowerRunDir, any_rank, gather_objects, init_distributed
from trainwise.train.early_stop import EarlyStopping
from trainwise.train.evaluation import headline_metrics, predict
from trainwise.train.nonfinite import first_nonfinite_module
from trainwise.train.optim import build_optimizer
from trainwise.train.precision import autocast, enable_tf32, make_scaler, resolve_precision
from trainwise.train.sampler import ResumableBatchSampler
from trainwise.train.schedule import build_scheduler
from trainwise.train.signals import GracefulStop
from trainwise.train.timing import StepTimer

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Trainer:
    def __init__(self, model: nn.Module, train_data: Dataset, val_data: Dataset | None = None, *,
                 config: RunConfig, run_dir: RunDir | None = None, callbacks: Sequence[Callback] = (),
                 loss_fn: LossFn | None = None, data_spec: DataSpec | None = None,
                 augment: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.config = config
        self.ranks = init_distributed()  # one process, or one rank of a torchrun job
        self.task = data_spec.task if data_spec else "classification"
        self.device = resolve_device(config.train.device)
        self.precision = resolve_precision(config.train.precision, self.device)
        self.tf32 = enable_tf32(self.device, config.train.tf32)
        self.model = model.to(self.device)
        self.ddp = DistributedDataParallel(self.model) if self.ranks.enabled else None
        self.forward = self.ddp or self.model
        if config.model.compile:
            self.forward = torch.compile(self.forward)
        self.train_data, self.val_data, self.augment = train_data, val_data, augment
        self.loss_fn = loss_fn or _default_loss(self.task, config.train.label_smoothing)
        self.run_dir = run_dir or RunDir.create(Path("runs") / time.strftime("run-%Y%m%d-%H%M%S"))
        if not self.ranks.is_main:
            self.run_dir = FollowerRunDir(self.run_dir.path)

        train = config.train
        self.micro_batch_size = train.micro_batch_size or train.batch_size
        per_step = self.micro_batch_size * self.ranks.world_size
        if train.batch_size % per_step:
            raise ConfigError(f"train.batch_size ({train.batch_size}) must be a multiple of micro_batch_size "
                              f"× ranks ({self.micro_batch_size} × {self.ranks.world_size} = {per_step}).")
        self.accumulation_steps = train.batch_size // per_step
        self.steps_per_epoch = len(train_data) // train.batch_size  # type: ignore[arg-type]
        if self.steps_per_epoch == 0:
            raise DataError(f"the training split has {len(train_data)} samples, fewer than one batch "  # type: ignore[arg-type]
                            f"(train.batch_size={train.batch_size}); lower the batch size.")
        self.max_steps = train.max_steps or math.ceil(train.epochs * self.steps_per_epoch)
        self.step = 0                 # optimizer steps done
        self.epoch = 0                # epochs started
        self.batch_in_epoch = 0       # optimizer steps done in this epoch
        self.skipped_steps = 0        # fp16 steps the scaler skipped (inf/nan gradients)

        self.optimizer = build_optimizer(self.model, config.optim)
        self.scheduler = build_scheduler(self.optimizer, config.schedule, self.max_steps)
        self.scaler = make_scaler(self.precision, self.device)
        self.early_stopping = EarlyStopping(config.eval.monitor_mode, config.eval.early_stopping.patience,
                                            config.eval.early_stopping.min_delta,
                                            enabled=config.eval.early_stopping.enabled)
        self.sampler = ResumableBatchSampler(len(train_data), self.micro_batch_size,  # type: ignore[arg-type]
                                             self.steps_per_epoch * self.accumulation_steps, seed=config.seed,
                                             rank=self.ranks.rank, world_size=self.ranks.world_size)
        settings = choose_loader_settings(self.device, config.data.num_workers, config.data.pin_memory)
        self.loader = build_loader(train_data, self.sampler, settings,
                                   generator=torch.Generator().manual_seed(config.seed))
        defaults = _default_callbacks(config) if self.ranks.is_main else []
        self.callbacks = CallbackList(defaults + list(callbacks))
        self._stop: GracefulStop | None = None
        self._stop_reason: str | None = None

    # ---- public ------------------------------------------------------------------------------------
    def fit(self, *, resume: bool = False) -> dict[str, Any]:
        """Train to `max_steps` (or an early stop, or a signal). `resume=True` continues from `last`."""
        started = time.time()
        if resume:
            self._load(self.run_dir.checkpoint_path("last"))
        else:
            self.run_dir.write_config(self.config)
            self.run_dir.log_event("started", f"training {self.max_steps} steps on {self.device} in "
                                   f"{self.precision}", step=0, evidence={"device": str(self.device), "tf32": self.tf32,
                                   "precision": self.precision, "accumulation_steps": self.accumulation_steps})
        self._write_summary("running", started)
        self.callbacks.on_fit_start(self)
        try:
            with GracefulStop(self._signalled) as self._stop:
                self._loop()
        except KeyboardInterrupt:
            message = (f"aborted by a second Ctrl-C during step {self.step + 1}; the last checkpoint is kept. "
                       f"Continue with: trainwise resume {self.run_dir.path}")
            summary = self._write_summary("stopped", started, message=message)
            self.callbacks.on_fit_end(self, summary)
            raise
        except BaseException as error:
            summary = self._write_summary("failed", started, message=f"{type(error).__name__}: {error}")
            self.callbacks.on_fit_end(self, summary)
            raise
        return self._finish(started)

    def request_stop(self, reason: str) -> None:
        """Stop after the current optimizer step (callbacks may call this)."""
        self._stop_reason = self._stop_reason or reason

    def evaluate(self, dataset: Dataset | None = None) -> dict[str, float]:
        outputs, targets = predict(self.model, dataset or self.val_data, device=self.device,
                                   batch_size=max(256, self.micro_batch_size), precision=self.precision)
        return headline_metrics(outputs, targets, self.task, self.loss_fn)

    # ---- the loop ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        timer = StepTimer(self.device)
        batches = self._batches(timer)
        while self.step < self.max_steps and self._stop_reason is None:
            loss = self._train_step(next(batches))
            self.step += 1
            self.batch_in_epoch += 1
            timer.step_done(loss, samples=self.config.train.batch_size)
            self.callbacks.on_step_end(self)
            end_of_epoch = self.batch_in_epoch == self.steps_per_epoch
            if self.step % self.config.train.log_every == 0 or self.step == self.max_steps:
                self._log_train(timer.flush())
            if end_of_epoch:
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            if self._eval_due(end_of_epoch):
                self._evaluate_and_checkpoint()
            elif self._checkpoint_due():
                self._save_checkpoint()
            if self.early_stopping.should_stop:
                self.request_stop("early_stop")
            if self.ranks.enabled and any_rank(self._stop_reason is not None, self.device):
                self.request_stop("signal:peer rank")  # every rank stops on the same step

    def _train_step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One optimizer step: accumulate micro-batch gradients, clip, step, advance the schedule."""
        total_loss = torch.zeros((), device=self.device)
        for i, (inputs, targets) in enumerate(micro_batches):
            inputs, targets = self._to_device(inputs, targets)
            last = i == len(micro_batches) - 1
            # DDP all-reduces gradients in backward; only the last micro-batch needs it
            with self.ddp.no_sync() if self.ddp and not last else nullcontext():
                with autocast(self.precision, self.device):
                    loss = self.loss_fn(self.forward(inputs), targets) / self.accumulation_steps
                self.scaler.scale(loss).backward()
            total_loss += loss.detach()
        self.scaler.unscale_(self.optimizer)  # clip and log the true gradient norm
        max_norm = self.config.train.grad_clip_norm or math.inf
        self.grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if not self.scaler.is_enabled() and not torch.isfinite(total_loss + self.grad_norm):
            self._fail_nonfinite(total_loss, inputs, targets)
        scale_before = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.step(self.optimizer)  # skipped by the scaler when fp16 gradients overflowed
        self.scaler.update()
        if scale_before is not None and self.scaler.get_scale() < scale_before:
            self.skipped_steps += 1
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)  # free the gradients before the next forward
        return total_loss

    def _batches(self, timer: StepTimer) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Groups of `accumulation_steps` micro-batches, epoch after epoch, from the saved data position."""
        while True:
            self.sampler.set_position(self.epoch, self.batch_in_epoch * self.accumulation_steps)
            group = []
            for micro_batch in timer.timed(iter(self.loader)):
                group.append(micro_batch)
                if len(group) == self.accumulation_steps:
                    yield group
                    group = []

    def _to_device(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = inputs.to(self.device, non_blocking=True)
        targets = targets.to(self.device, non_blocking=True)
        if self.augment is not None:
            inputs = self.augment(inputs)
        return inputs, targets

    # ---- evaluation, checkpoints, logs ---------------------------------------------------------------
    def _eval_due(self, end_of_epoch: bool) -> bool:
        if self.val_data is None:
            return False
        every = self.config.eval.every_steps
        return bool((every and self.step % every == 0) or (end_of_epoch and self.config.eval.every_epoch)
                    or self.step == self.max_steps)

    def _checkpoint_due(self) -> bool:
        every = self.config.checkpoint.every_steps
        return bool(every and self.step % every == 0) or self.step == self.max_steps

    def _evaluate_and_checkpoint(self) -> None:
        metrics = self.evaluate()
        record = {"split": "val", "step": self.step, "epoch": self.epoch, **metrics}
        self.run_dir.log_metrics(record)
        self.callbacks.on_eval(self, record)
        name = self.config.eval.monitor.removeprefix("val/")
        if name not in metrics:
            raise TrainingError(f"eval.monitor: {self.config.eval.monitor!r} is not measured; validation "
                                f"gives {', '.join('val/' + k for k in metrics)}.")
        is_best = self.early_stopping.update(metrics[name], self.step)
        self._save_checkpoint(is_best=is_best)

    def _save_checkpoint(self, *, is_best: bool = False) -> None:
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "early_stopping": self.early_stopping.state_dict(),
            "rng": ckpt.capture_rng(),
            "rng_per_rank": gather_objects(ckpt.capture_rng()) if self.ranks.enabled else [],
            "data_position": {"epoch": self.epoch, "batch": self.batch_in_epoch},
            "step": self.step,
            "epoch": self.epoch,
            "skipped_steps": self.skipped_steps,
        }
        path = self.run_dir.save_checkpoint(self.step, ckpt.checkpoint_writer(state), is_best=is_best,
                                            keep_last=self.config.checkpoint.keep_last)
        self.callbacks.on_checkpoint(self, path)

    def _load(self, path: Path) -> None:
        state = ckpt.read_checkpoint(path)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.early_stopping.load_state_dict(state["early_stopping"])
        per_rank = state.get("rng_per_rank") or []
        ckpt.restore_rng(per_rank[self.ranks.rank] if len(per_rank) == self.ranks.world_size else state["rng"])
        self.epoch = state["data_position"]["epoch"]
        self.batch_in_epoch = state["data_position"]["batch"]
        self.step = state["step"]
        self.skipped_steps = state["skipped_steps"]
        self.run_dir.drop_metrics_after(self.step)
        self.run_dir.log_event("resumed", f"resumed from step {self.step} (epoch {self.epoch}, batch "
                               f"{self.batch_in_epoch})", step=self.step, evidence={"checkpoint": path.name})

    def _log_train(self, timing: dict[str, float]) -> None:
        record = {"split": "train", "step": self.step, "epoch": self.epoch, **timing,
                  "lr": self.scheduler.get_last_lr()[0], "grad_norm": float(self.grad_norm),
                  "skipped_steps": self.skipped_steps}
        self.run_dir.log_metrics(record)
        self.callbacks.on_log(self, record)

    def _signalled(self, name: str) -> None:
        self.request_stop(f"signal:{name}")
        self.run_dir.log_event("signal", f"{name} received; stopping after step {self.step + 1}",
                               severity="warning", step=self.step)

    def _fail_nonfinite(self, total_loss: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        culprit = first_nonfinite_module(self.model, lambda: self.forward(inputs))
        if culprit:
            where = f"first non-finite output: {culprit[0]} ({culprit[1]})"
        else:
            where = "every module's output was finite, so the gradients overflowed in backward"
        message = (f"non-finite loss or gradients at step {self.step + 1} (loss "
                   f"{float(total_loss * self.accumulation_steps):.4g}, grad norm {float(self.grad_norm):.4g}); "
                   f"{where}. Lower optim.lr, check the inputs for NaN/Inf, or keep train.grad_clip_norm on. "
                   "The weights are those before this step.")
        self.run_dir.log_event("nonfinite", message, severity="error", step=self.step + 1,
                               evidence={"module": culprit[0] if culprit else None,
                                         "grad_norm": float(self.grad_norm)})
        raise TrainingError(message)

    def _finish(self, started: float) -> dict[str, Any]:
        if self._stop_reason is None or self._stop_reason == "early_stop":
            if not self._checkpoint_current():
                self._save_checkpoint()
            if self._stop_reason == "early_stop":
                self.run_dir.log_event("early_stop", f"{self.config.eval.monitor} did not improve for "
                                       f"{self.early_stopping.patience} evaluations; stopped at step "
                                       f"{self.step}", step=self.step, evidence=self.early_stopping.state_dict())
            restored = self._restore_best()
            self.run_dir.write_model(self.model.state_dict(), {"step": str(self.step), "restored_best": str(restored)})
            summary = self._write_summary("completed", started, restored_best=restored)
        else:
            self._save_checkpoint()
            message = (f"stopped by {self._stop_reason.split(':')[-1]} after step {self.step}; checkpoint "
                       f"written. Continue with: trainwise resume {self.run_dir.path}")
            self.run_dir.log_event("stopped", message, severity="warning", step=self.step)
            summary = self._write_summary("stopped", started, message=message)
        self.callbacks.on_fit_end(self, summary)
        return summary

    def _checkpoint_current(self) -> bool:
        steps = self.run_dir.step_checkpoints()
        return bool(steps) and steps[-1][0] == self.step

    def _restore_best(self) -> bool:
        es = self.config.eval.early_stopping
        best = self.run_dir.checkpoint_path("best")
        if not (es.enabled and es.restore_best and best.exists()) or self.early_stopping.best_step == self.step:
            return False
        self.model.load_state_dict(ckpt.read_checkpoint(best)["model"])
        return True

    def _write_summary(self, status: str, started: float, message: str | None = None,
                       restored_best: bool = False) -> dict[str, Any]:
        val = self.run_dir.read_metrics("val")
        train = self.run_dir.read_metrics("train")
        wall = time.time() - started
        summary = {
            "status": status, "steps": self.step, "max_steps": self.max_steps, "epoch": self.epoch,
            "best": {"metric": self.config.eval.monitor, "value": self.early_stopping.best,
                     "step": self.early_stopping.best_step},
            "final": val[-1] if val else {}, "restored_best": restored_best,
            "timings": {"wall_s": wall,
                        "samples_per_s": train[-1]["samples_per_s"] if train else None},
            "device": str(self.device), "precision": self.precision, "tf32": self.tf32,
            "skipped_steps": self.skipped_steps, "message": message,
        }
        self.run_dir.write_summary(summary)
        return summary


def _default_loss(task: str, label_smoothing: float) -> LossFn:
    if task == "regression":
        return lambda outputs, targets: nn.functional.mse_loss(outputs.squeeze(-1).float(), targets.float())
    return nn.CrossEntropyLoss(label_smoothing=label_smoothing)


def _default_callbacks(config: RunConfig) -> list[Callback]:
    from trainwise.train.progress import ProgressDisplay, TensorBoardLog

    callbacks: list[Callback] = [ProgressDisplay()]
    if TensorBoardLog.available():
        callbacks.append(TensorBoardLog())
    if config.telemetry.enabled:
        from trainwise.telemetry.sampler import TelemetryCallback

        callbacks.append(TelemetryCallback(config.telemetry))
    return callbacks
