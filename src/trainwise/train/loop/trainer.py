"""The training loop: `Trainer(model, train_data, val_data, config=...).fit()` trains a plain nn.Module on plain
Datasets. The batch contract (what a dataset yields, what the model and the loss receive) is data/batch.py's;
`train.batch_size` samples make one optimizer step, fed as `batch_size / micro_batch_size` micro-batches.

The loop never waits for the device between log steps: each step's loss, gradient norm and skip flag stay device
tensors read at log steps, evaluations and checkpoints (the "settle points", where ranks also agree on stopping).
Its parts are made by builder.py; callbacks are given a TrainerView (callbacks/base.py), never the Trainer.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from trainwise.config import RunConfig, accumulation_steps
from trainwise.data.bundle import DataSpec
from trainwise.data.loader import release_workers
from trainwise.diagnose.failure import record_failure
from trainwise.errors import TrainingError
from trainwise.rundir.layout import RunDir
from trainwise.runtime.inference import split_metrics
from trainwise.runtime.precision import autocast
from trainwise.train.callbacks.base import Callback, CallbackList, TrainerView
from trainwise.train.loop.builder import TrainerParts, build_parts
from trainwise.train.loop.health import StepHealth, health_problem, unhealthy
from trainwise.train.loop.summary import RunFacts, RunSummary, early_stop_message, stopped_message
from trainwise.train.loop.timing import StepTimer
from trainwise.train.parallel.distributed import agree_on_stopping, peer_lost, reduce_log_record, resume_command
from trainwise.train.recovery.signals import GracefulStop
from trainwise.train.step.nonfinite import first_nonfinite_in
from trainwise.train.step.train_step import LossFn, MicroBatch, StepOutcome
from trainwise.train.callbacks.token_rates import record_attention


class Trainer:
    def __init__(self, model: nn.Module, train_data: Dataset, val_data: Dataset | None = None, *,
                 config: RunConfig, run_dir: RunDir | None = None, callbacks: Sequence[Callback] = (),
                 loss_fn: LossFn | None = None, data_spec: DataSpec | None = None,
                 augment: Callable[[torch.Tensor], torch.Tensor] | None = None, built_from_config: bool = False):
        self._adopt(build_parts(model, train_data, val_data, config=config, run_dir=run_dir, loss_fn=loss_fn,
                                data_spec=data_spec, augment=augment, built_from_config=built_from_config), callbacks)

    @classmethod
    def from_parts(cls, parts: TrainerParts, callbacks: Sequence[Callback] = ()) -> Trainer:
        """A Trainer over parts `build_parts` made (launch/ makes its callbacks from them first)."""
        trainer = cls.__new__(cls)
        trainer._adopt(parts, callbacks)
        return trainer

    def _adopt(self, parts: TrainerParts, callbacks: Sequence[Callback]) -> None:
        """Hold the parts the loop runs (builder.py made them) and what it keeps between its steps."""
        self.config, self.task, self.run_dir, self.state = parts.config, parts.task, parts.run_dir, parts.state
        self.placement = where = parts.placement  # ranks, strategy, device, precision, tf32
        self.ranks, self.device, self.precision = where.ranks, where.device, where.precision
        self.model, self.forward, self.loss_fn = parts.model, parts.forward, parts.loss_fn
        self.val_data = parts.val_data
        self.train_step, self.oom_guard, self.token_figures = parts.train_step, parts.oom_guard, parts.token_figures
        self.scheduler, self.scaler = parts.train_step.scheduler, parts.train_step.scaler
        self.early_stopping, self.checkpointer = parts.early_stopping, parts.checkpointer
        self.max_steps, self.steps_per_epoch, self.cadence = parts.max_steps, parts.steps_per_epoch, parts.cadence
        self.sampler, self.loader = parts.sampler, parts.loader
        self.callbacks = CallbackList([*parts.callbacks, *callbacks])
        self.health = StepHealth(self.device)
        self._outcome: StepOutcome | None = None
        self._last_checkpoint_step: int | None = None  # every rank knows it: no rank asks the disk
        self._settled_step: int | None = None
        self._stop: GracefulStop | None = None
        self._stop_reason: str | None = None
        self._summary = RunSummary()  # summary.json: at the start, at every checkpoint, at the end
        self._metrics: dict[str, dict[str, Any]] = {}  # the newest record of each split, for the view
        # what every callback is given: where the run is and what it may ask, not the Trainer
        self.view = TrainerView(self.config, self.run_dir, self.device, self.model, self.state, self.max_steps,
                                MappingProxyType(self._metrics), self.request_stop, self.evaluate_and_checkpoint)

    # ---- where the run is: self.state (TrainState), which the loop advances and a checkpoint restores -----
    step = property(lambda self: self.state.step)
    epoch = property(lambda self: self.state.epoch)
    micro_batch_size = property(lambda self: self.state.micro_batch_size)

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches this rank accumulates per optimizer step (config.derived decides how)."""
        return accumulation_steps(self.config.train.batch_size, self.state.micro_batch_size, self.ranks.world_size)

    @property
    def eval_batch_size(self) -> int:
        # inference keeps no activations for backward: twice the training micro-batch fits where it did
        # (predict halves it again on an out-of-memory error)
        return 2 * self.state.micro_batch_size

    # ---- public ------------------------------------------------------------------------------------
    def fit(self, *, resume: bool = False) -> dict[str, Any]:
        """Train to `max_steps` (or an early stop, or a signal). `resume=True` continues from `last`."""
        started = time.time()
        self._resume() if resume else self._start()
        self._write_summary("running", started)
        self.callbacks.on_fit_start(self.view)
        # the signal handler only sets a flag; the loop acts on it
        with self._ending_recorded(started, saving=False), GracefulStop() as self._stop:
            try:
                self._loop()
            finally:
                release_workers(self.loader)
        # a peer lost during the final (collective) save, or a disk that fills, fails the run like a step does;
        # the run stops anyway: a first signal must not cut the final save
        with self._ending_recorded(started, saving=True), GracefulStop():
            summary = self._final_writes(started)
        self.callbacks.on_fit_end(self.view, summary)
        return summary

    def request_stop(self, reason: str) -> None:
        """Stop after the current optimizer step (callbacks may call this)."""
        self._stop_reason = self._stop_reason or reason

    def evaluate(self, dataset: Dataset | None = None) -> dict[str, float]:
        return split_metrics(self.model, dataset or self.val_data, task=self.task.eval_kind,
                             loss_fn=self.loss_fn, device=self.device, batch_size=self.eval_batch_size,
                             precision=self.precision)

    # ---- the loop ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        state, timer = self.state, StepTimer(self.device, self.token_figures)

        def step_groups():  # the data position (TrainState) cut into micro-batches, `accumulation_steps` a step
            return self.sampler.step_groups(self.loader, state, self.accumulation_steps, self.steps_per_epoch,
                                            timer.timed)

        batches = step_groups()
        while self.step < self.max_steps and self._stop_reason is None:
            micro_batches = next(batches)
            outcome, out_of_memory_on = self.oom_guard.step(micro_batches)
            if outcome is None:  # out of memory (agreed by every rank): retry the same samples, smaller
                del micro_batches
                self.oom_guard.recover(out_of_memory_on)  # a smaller micro-batch in self.state, or recomputation
                batches = step_groups()  # the same position, cut into the new micro-batches
                continue
            self._outcome = outcome
            state.step += 1
            state.batch_in_epoch += 1
            self.health.record(self.step, self._outcome, micro_batches)
            timer.step_done(self._outcome.loss, samples=self.config.train.batch_size, micro_batches=micro_batches)
            self.callbacks.on_step_end(self.view)
            end_of_epoch = state.batch_in_epoch == self.steps_per_epoch
            log_due = self.cadence.should_log(self.step)
            eval_due = self.cadence.should_evaluate(self.step, end_of_epoch=end_of_epoch)
            checkpoint_due = not eval_due and self.cadence.should_checkpoint(self.step)
            if log_due or eval_due or checkpoint_due:
                self._settle(micro_batches)
            elif not self.ranks.enabled:
                self._take_signal(self._stop.requested if self._stop else None)  # a host flag: free
            del micro_batches
            if log_due:  # every rank logs on the same steps: the record is reduced over all of them
                timing = timer.flush()
                self._log_train(reduce_log_record(timing, self.device) if self.ranks.enabled else timing)
            if end_of_epoch:
                state.epoch, state.batch_in_epoch = state.epoch + 1, 0
            with timer.paused():  # not step time: the next log line reports the steps' own rate
                if eval_due:
                    self.evaluate_and_checkpoint()
                elif checkpoint_due:
                    self._save_checkpoint()
            if self.early_stopping.should_stop:
                self.request_stop("early_stop")
        if self._settled_step != self.step:  # stopped by a signal between settle points
            self._settle(None)

    def _settle(self, micro_batches: list[MicroBatch] | None) -> None:
        """Read what the steps since the last settle point went through (one transfer) and act on it; under
        torchrun every rank takes the same decision from one small all-reduce of the flags."""
        self._settled_step = self.step
        reading = self.health.read()
        self.state.skipped_steps = reading.skipped_steps
        problem = health_problem(reading, fp16=self.scaler.is_enabled(), step=self.step,
                                 loss_scale=self.scaler.get_scale() if self.scaler.is_enabled() else 1.0)
        problem, signal = agree_on_stopping(problem, self._stop.requested if self._stop else None, self.ranks,
                                            self.device)
        if problem is not None:  # replay the last micro-batch's forward to find where NaN/Inf first shows
            culprit = first_nonfinite_in(self.model, self.forward, micro_batches[-1], self.device,
                                         autocast(self.precision, self.device)) if micro_batches else None
            raise unhealthy(self.run_dir, problem, reading, culprit, step=self.step, lr=self.scheduler.get_last_lr()[0])
        self._take_signal(signal)

    def _take_signal(self, signal: str | None) -> None:
        if signal is None or self._stop_reason is not None:
            return
        self.request_stop(f"signal:{signal}")
        self.run_dir.log_event("signal", f"{signal} received; stopping after step {self.step}",
                               severity="warning", step=self.step)

    # ---- evaluation, checkpoints, logs ---------------------------------------------------------------
    def evaluate_and_checkpoint(self) -> None:
        """The evaluation point: validate, record it (metrics.jsonl, callbacks' on_eval), update early stopping
        and checkpoint (as `best` when it is). The loop calls it when `cadence.should_evaluate`; a callback may
        call it at on_fit_start (a model fitted by counting is validated once, as built: run_task.py)."""
        metrics = self.evaluate()
        record = {"split": "val", "step": self.step, "epoch": self.epoch, **metrics}
        self.run_dir.log_metrics(record)
        self._metrics["val"] = record
        self.callbacks.on_eval(self.view, record)
        name = self.config.eval.monitor.removeprefix("val/")
        if name not in metrics:
            raise TrainingError(f"eval.monitor: {self.config.eval.monitor!r} is not measured; validation "
                                f"gives {', '.join('val/' + k for k in metrics)}.")
        is_best = self.early_stopping.update(metrics[name], self.step)
        self._save_checkpoint(is_best=is_best)

    def _save_checkpoint(self, *, is_best: bool = False) -> None:
        path = self.checkpointer.save(is_best=is_best)
        self._last_checkpoint_step = self.step  # only once it is on disk: a resume continues from here
        if self._summary.started is not None and self.ranks.is_main:  # a killed run's summary shows its progress
            self._write_summary("running", self._summary.started)
        self.callbacks.on_checkpoint(self.view, path)

    def _start(self) -> None:
        attention = record_attention(self.config, self.model)  # a Hugging Face model's, in config.yaml too
        self.run_dir.write_config(self.config)
        facts = {**self.placement.facts(), "accumulation_steps": self.accumulation_steps, "attention": attention}
        self.run_dir.log_event("started", f"training {self.max_steps} steps on {self.device} in {self.precision}",
                               step=0, evidence=facts)

    def _resume(self) -> None:
        self.checkpointer.resume()  # `last`, or the newest intact step; the same on every rank
        self.train_step.steps_done = self.step
        self.health = StepHealth(self.device, skipped_steps=self.state.skipped_steps)
        self._last_checkpoint_step = self.step
        if self.early_stopping.should_stop:  # it stopped early, then was cut off in its final save
            self.request_stop("early_stop")

    def _log_train(self, timing: dict[str, float]) -> None:
        grad_norm = float(self._outcome.grad_norm) if self._outcome is not None else math.nan
        record = {"split": "train", "step": self.step, "epoch": self.epoch, **timing,
                  "lr": self.scheduler.get_last_lr()[0], "grad_norm": grad_norm,
                  "skipped_steps": self.state.skipped_steps}
        self.run_dir.log_metrics(record)
        self._metrics["train"] = record
        self.callbacks.on_log(self.view, record)

    @contextmanager
    def _ending_recorded(self, started: float, *, saving: bool) -> Iterator[None]:
        """How a run that does not finish says so: a second Ctrl-C (the first only asks the loop to stop) leaves
        a `stopped` summary with how to continue, anything else a `failed` one with the cause; both re-raise.
        `saving`: during the final writes, whose step is done, rather than during a step of the loop."""
        try:
            yield
        except KeyboardInterrupt:
            kept = (f"while saving step {self.step}; the checkpoint of step {self._last_checkpoint_step} is kept."
                    if saving else f"during step {self.step + 1}; the last checkpoint is kept.")
            message = f"aborted by a second Ctrl-C {kept} Continue with: {resume_command(self.run_dir.path)}"
            self.callbacks.on_fit_end(self.view, self._write_summary("stopped", started, message=message))
            raise
        except BaseException as error:  # recorded (the summary says `failed` with the cause), then raised
            failure = peer_lost(error, self.ranks, self.step if saving else self.step + 1) or error  # say whose
            summary = self._write_summary("failed", started, message=record_failure(self.run_dir, failure, self.step))
            self.callbacks.on_fit_end(self.view, summary)
            if failure is error:
                raise
            raise failure from error

    def _final_writes(self, started: float) -> dict[str, Any]:
        """The final writes, in an order that leaves a consistent run at every instant: the last checkpoint
        and a `running` summary of its step (resumable), then the weights, then the `completed` summary.
        A signal during them is held until they are done; a second Ctrl-C, or a kill, leaves the run
        resumable from the last checkpoint, and the resume ends with the same weights."""
        if self._last_checkpoint_step != self.step:
            self._save_checkpoint()  # the summary now says `running` at this step: resumable from here
        if self._stop_reason is not None and self._stop_reason != "early_stop":
            message = stopped_message(self._stop_reason, self._run_facts())
            self.run_dir.log_event("stopped", message, severity="warning", step=self.step)
            return self._write_summary("stopped", started, message=message)
        # model.safetensors holds the best step's weights when early stopping restores them; the final
        # step's stay in the last checkpoint (`eval --checkpoint final` reads them from there)
        restored = self.checkpointer.restore_best()
        weights_step = self.early_stopping.best_step if restored else self.step
        message = early_stop_message(self._run_facts(), restored) if self._stop_reason == "early_stop" else None
        if message:
            self.run_dir.log_event("early_stop", message, step=self.step, evidence=self.early_stopping.state_dict())
        self.checkpointer.write_final(weights_step=weights_step, restored=restored)  # and a LoRA run's adapter
        return self._write_summary("completed", started, message=message, restored_best=restored)

    def _write_summary(self, status: str, started: float, message: str | None = None,
                       restored_best: bool = False) -> dict[str, Any]:
        return self._summary.write(self._run_facts(), status, started, message=message, restored_best=restored_best)

    def _run_facts(self) -> RunFacts:
        return RunFacts(self.run_dir, self.state, self.early_stopping, max_steps=self.max_steps,
                        monitor=self.config.eval.monitor, last_checkpoint_step=self._last_checkpoint_step,
                        device=str(self.device), precision=self.precision, tf32=self.placement.tf32,
                        task=self.task.profile.to_dict() if self.task.profile is not None else None)

