"""The training loop: `Trainer(model, train_data, val_data, config=...).fit()` trains a plain nn.Module on plain
Datasets. The batch contract (what a dataset yields, what the model and the loss receive) is data/batch.py's;
`train.batch_size` samples make one optimizer step, fed as `batch_size / micro_batch_size` micro-batches.

The loop never waits for the device between log steps: each step's loss, gradient norm and skip flag stay device
tensors read at log steps, evaluations and checkpoints (the "settle points", where ranks also agree on stopping).
"""
from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn
from torch.utils.data import Dataset

from trainwise.config import RunConfig, accumulation_steps
from trainwise.data.bundle import DataSpec
from trainwise.diagnose.failure import record_failure
from trainwise.data.loader import batch_bytes, build_loader, choose_loader_settings, release_workers
from trainwise.errors import RunDirWarning, TrainingError
from trainwise.rundir.layout import RunDir
from trainwise.train.recovery import checkpoint as ckpt
from trainwise.train.loop.cadence import Cadence
from trainwise.train.callbacks.base import Callback, CallbackList
from trainwise.train.callbacks.defaults import default_callbacks
from trainwise.runtime.device import resolve_device
from trainwise.train.parallel.distributed import (FollowerRunDir, agree, init_distributed, peer_lost, reduce_log_record,
                                         resolve_strategy, resume_command, wrap_model)
from trainwise.train.callbacks.early_stop import EarlyStopping
from trainwise.runtime.inference import split_metrics
from trainwise.train.step.master_weights import computing_precision, record_lost_updates, watch_lost_updates
from trainwise.train.loop.health import HealthReading, StepHealth, health_problem
from trainwise.train.step.nonfinite import first_nonfinite_in
from trainwise.runtime.precision import autocast, enable_tf32, resolve_precision
from trainwise.train.recovery.oom import OomGuard
from trainwise.train.loop.run_task import planned_steps, run_task
from trainwise.train.parallel.sampler import ResumableBatchSampler, seeded_by_position
from trainwise.train.step.schedule import build_scheduler
from trainwise.train.recovery.signals import GracefulStop
from trainwise.train.step.state import TrainState
from trainwise.train.step.train_step import LossFn, MicroBatch, StepOutcome, TrainStep, default_loss
from trainwise.train.loop.summary import RunFacts, RunSummary, early_stop_message, stopped_message
from trainwise.train.callbacks.token_rates import TokenFigures, record_attention
from trainwise.train.loop.timing import StepTimer


class Trainer:
    def __init__(self, model: nn.Module, train_data: Dataset, val_data: Dataset | None = None, *,
                 config: RunConfig, run_dir: RunDir | None = None, callbacks: Sequence[Callback] = (),
                 loss_fn: LossFn | None = None, data_spec: DataSpec | None = None,
                 augment: Callable[[torch.Tensor], torch.Tensor] | None = None, built_from_config: bool = False):
        self.config = config = (what := run_task(model, train_data, val_data, config, data_spec, built_from_config)).config
        self.task, self.profile, self.eval_kind = what.data_spec.task, what.profile, what.eval_kind  # run_task.py
        self.train_data, self.val_data, self.augment = train_data, val_data, augment
        # the order matters: the ranks decide the device, the device the precision and the model's wrapping,
        # the wrapped model the step, the step's micro-batch the sampler and the loader
        no_sync = self._setup_ranks_and_model(model)
        self.run_dir = run_dir or RunDir.create(Path("runs") / time.strftime("run-%Y%m%d-%H%M%S"))
        if not self.ranks.is_main:
            self.run_dir = FollowerRunDir(self.run_dir.path)
        config.train.refuse_unresolved_auto()
        # unset: the global batch split over the ranks (config decides, and refuses what cannot work)
        self.state = TrainState(micro_batch_size=config.train.micro_batch_for(self.ranks.world_size))
        self.steps_per_epoch = config.train.steps_per_epoch(len(train_data))  # type: ignore[arg-type]
        self.max_steps = planned_steps(model, config, len(train_data))  # type: ignore[arg-type]
        self.cadence = Cadence.from_config(config, max_steps=self.max_steps, has_validation=val_data is not None)
        self._last_checkpoint_step: int | None = None  # every rank knows it: no rank asks the disk
        self._settled_step: int | None = None
        self._setup_step(loss_fn, no_sync)
        self._setup_data()
        self.checkpointer = ckpt.Checkpointer(
            self.run_dir, config, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            scaler=self.scaler, early_stopping=self.early_stopping, state=self.state, ranks=self.ranks,
            sharded=config.train.sharded_checkpoints)
        defaults = default_callbacks(config) if self.ranks.is_main else []
        self.callbacks = CallbackList(defaults + list(callbacks))
        self._stop: GracefulStop | None = None
        self._stop_reason: str | None = None
        self._summary = RunSummary()  # summary.json: at the start, at every checkpoint, at the end

    def _setup_ranks_and_model(self, model: nn.Module):
        """One process, or one rank of a torchrun job: its device, precision and the model placed and wrapped
        for the strategy (DDP, FSDP2). Returns DDP's no_sync, for the step."""
        train = self.config.train
        self.ranks = init_distributed(train.dist_timeout_s, sharded=train.strategy in ("ddp", "fsdp"))
        self.strategy = resolve_strategy(train.strategy, self.ranks)
        self.device = resolve_device(train.device, self.ranks.local_rank if self.ranks.enabled else None)
        self.precision = computing_precision(resolve_precision(train.precision, self.device), self.config.model)
        self.tf32 = enable_tf32(self.device, train.tf32)
        self.model = model.to(self.device)
        self.forward, no_sync = wrap_model(self.model, self.strategy, device=self.device, precision=self.precision,
                                           cpu_offload=train.fsdp_cpu_offload,
                                           loss_chunk=self.config.model.loss_chunk_size)
        if self.config.model.compile:
            self.forward = torch.compile(self.forward)
        return no_sync

    def _setup_step(self, loss_fn: LossFn | None, no_sync) -> None:
        """The step (TrainStep.from_config, as everywhere a step runs), its out-of-memory guard, its schedule
        and early stopping."""
        config = self.config
        self.loss_fn = loss_fn or default_loss(self.task, config.train.label_smoothing)
        self.train_step = TrainStep.from_config(self.model, config, task=self.task, device=self.device,
                                                precision=self.precision, loss_fn=self.loss_fn, forward=self.forward,
                                                no_sync=no_sync, augment=self.augment)
        self.optimizer, self.scaler = self.train_step.optimizer, self.train_step.scaler
        watch_lost_updates(self.optimizer, self.model, config.model, record_lost_updates(self.run_dir))
        self.scheduler = self.train_step.scheduler = build_scheduler(self.optimizer, config.schedule, self.max_steps)
        # runs each step so that running out of memory is recoverable, on every rank alike (recovery.py)
        self.oom_guard = OomGuard(self.train_step, self.state, self.run_dir, self.ranks,
                                  batch_size=config.train.batch_size, ddp=self.strategy == "ddp",
                                  recover=config.train.oom_policy == "recover")
        self.token_figures = TokenFigures(self.model)  # tokens/s and MFU of token batches
        self.health = StepHealth(self.device)
        self._outcome: StepOutcome | None = None
        es = config.eval.early_stopping
        self.early_stopping = EarlyStopping(config.eval.monitor_mode, es.patience, es.min_delta, enabled=es.enabled)

    def _setup_data(self) -> None:
        """The sampler (resumable at any position) and the loader over the training data."""
        config, data = self.config, self.train_data
        self.sampler = ResumableBatchSampler(len(data), self.micro_batch_size,  # type: ignore[arg-type]
                                             self.steps_per_epoch * self.accumulation_steps, seed=config.seed,
                                             rank=self.ranks.rank, world_size=self.ranks.world_size)
        settings = choose_loader_settings(self.device, config.data.num_workers, config.data.pin_memory,
                                          batch_bytes=batch_bytes(data, self.micro_batch_size))
        # worker processes reseed their RNGs per batch from (seed, epoch, position): random transforms
        # in a Dataset resume exactly; in-process loading shares the checkpointed global RNG instead
        fetched = seeded_by_position(data) if settings.num_workers > 0 else data
        self.loader = build_loader(fetched, self.sampler, settings, generator=torch.Generator().manual_seed(config.seed))

    # ---- where the run is (TrainState) -----------------------------------------------------------------
    step = property(lambda self: self.state.step, lambda self, value: setattr(self.state, "step", value))
    epoch = property(lambda self: self.state.epoch, lambda self, value: setattr(self.state, "epoch", value))
    batch_in_epoch = property(lambda self: self.state.batch_in_epoch,
                              lambda self, value: setattr(self.state, "batch_in_epoch", value))
    skipped_steps = property(lambda self: self.state.skipped_steps,
                             lambda self, value: setattr(self.state, "skipped_steps", value))

    @property
    def micro_batch_size(self) -> int:
        return self.state.micro_batch_size

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
        self.callbacks.on_fit_start(self)
        with self._ending_recorded(started, saving=False):
            with GracefulStop() as self._stop:  # the handler only sets a flag; the loop acts on it
                try:
                    self._loop()
                finally:
                    release_workers(self.loader)
        return self._finish(started)

    def request_stop(self, reason: str) -> None:
        """Stop after the current optimizer step (callbacks may call this)."""
        self._stop_reason = self._stop_reason or reason

    def evaluate(self, dataset: Dataset | None = None) -> dict[str, float]:
        return split_metrics(self.model, dataset or self.val_data, task=self.eval_kind, loss_fn=self.loss_fn,
                             device=self.device, batch_size=self.eval_batch_size, precision=self.precision)

    # ---- the loop ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        timer = StepTimer(self.device, self.token_figures)
        batches = self._batches(timer)
        while self.step < self.max_steps and self._stop_reason is None:
            micro_batches = next(batches)
            outcome, out_of_memory_on = self.oom_guard.step(micro_batches)
            if outcome is None:  # out of memory (agreed by every rank): retry the same samples, smaller
                del micro_batches
                self.oom_guard.recover(out_of_memory_on)  # a smaller micro-batch in self.state, or recomputation
                batches = self._batches(timer)  # the same position, cut into the new micro-batches
                continue
            self._outcome = outcome
            self.step += 1
            self.batch_in_epoch += 1
            self.health.record(self.step, self._outcome, micro_batches)
            timer.step_done(self._outcome.loss, samples=self.config.train.batch_size, micro_batches=micro_batches)
            self.callbacks.on_step_end(self)
            end_of_epoch = self.batch_in_epoch == self.steps_per_epoch
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
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
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
        self.skipped_steps = reading.skipped_steps
        problem = health_problem(reading, fp16=self.scaler.is_enabled(), step=self.step,
                                 loss_scale=self.scaler.get_scale() if self.scaler.is_enabled() else 1.0)
        signal = self._stop.requested if self._stop else None
        if self.ranks.enabled:
            peer_problem, peer_signal = agree([problem is not None, signal is not None], self.device)
            if peer_problem and problem is None:
                problem = "another rank saw a non-finite loss or gradients; its log has the evidence."
            signal = signal or ("peer rank" if peer_signal else None)
        if problem is not None:
            self._fail_unhealthy(problem, reading, micro_batches)
        self._take_signal(signal)

    def _take_signal(self, signal: str | None) -> None:
        if signal is None or self._stop_reason is not None:
            return
        self.request_stop(f"signal:{signal}")
        self.run_dir.log_event("signal", f"{signal} received; stopping after step {self.step}",
                               severity="warning", step=self.step)

    def _batches(self, timer: StepTimer) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Groups of `accumulation_steps` micro-batches, epoch after epoch, from the saved data position, cut
        at the TrainState's micro-batch size (an out-of-memory recovery starts a new generator)."""
        while True:
            self.sampler.set_position(self.epoch, self.batch_in_epoch * self.accumulation_steps,
                                      micro_batch_size=self.micro_batch_size,
                                      batches_per_epoch=self.steps_per_epoch * self.accumulation_steps)
            group = []
            for micro_batch in timer.timed(iter(self.loader)):
                group.append(micro_batch)
                if len(group) == self.accumulation_steps:
                    yield group
                    group = []

    # ---- evaluation, checkpoints, logs ---------------------------------------------------------------
    def evaluate_and_checkpoint(self) -> None:
        """The evaluation point: validate, record it (metrics.jsonl, callbacks' on_eval), update early stopping
        and checkpoint (as `best` when it is). The loop calls it when `cadence.should_evaluate`; a callback may
        call it at on_fit_start (a model fitted by counting is validated once, as built: run_task.py)."""
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
        path = self.checkpointer.save(is_best=is_best)
        self._last_checkpoint_step = self.step  # only once it is on disk: a resume continues from here
        if self._summary.started is not None and self.ranks.is_main:  # a killed run's summary shows its progress
            self._write_summary("running", self._summary.started)
        self.callbacks.on_checkpoint(self, path)

    def _start(self) -> None:
        attention = record_attention(self.config, self.model)  # a Hugging Face model's, in config.yaml too
        self.run_dir.write_config(self.config)
        facts = {"device": str(self.device), "tf32": self.tf32, "precision": self.precision, "strategy": self.strategy,
                 "accumulation_steps": self.accumulation_steps, "ranks": self.ranks.world_size, "attention": attention}
        self.run_dir.log_event("started", f"training {self.max_steps} steps on {self.device} in {self.precision}",
                               step=0, evidence=facts)

    def _resume(self) -> None:
        choice = self.checkpointer.choose()  # `last`, or the newest intact step; the same on every rank
        if choice.notice:
            self.run_dir.log_event("checkpoint_fallback", choice.notice, severity="warning", step=choice.step)
            if self.ranks.is_main:  # said at the terminal too, not only recorded in events.jsonl
                warnings.warn(choice.notice, RunDirWarning, stacklevel=3)
        self._load(choice.path)

    def _load(self, path: Path) -> None:
        self.checkpointer.load(path)
        self.train_step.steps_done = self.step
        self.health = StepHealth(self.device, skipped_steps=self.skipped_steps)
        self._last_checkpoint_step = self.step
        if self.early_stopping.should_stop:  # it stopped early, then was cut off in its final save
            self.request_stop("early_stop")
        self.run_dir.drop_metrics_after(self.step)
        self.run_dir.log_event("resumed", f"resumed from step {self.step} (epoch {self.epoch}, batch "
                               f"{self.batch_in_epoch})", step=self.step, evidence={"checkpoint": path.name})

    def _log_train(self, timing: dict[str, float]) -> None:
        grad_norm = float(self._outcome.grad_norm) if self._outcome is not None else math.nan
        record = {"split": "train", "step": self.step, "epoch": self.epoch, **timing,
                  "lr": self.scheduler.get_last_lr()[0], "grad_norm": grad_norm,
                  "skipped_steps": self.skipped_steps}
        self.run_dir.log_metrics(record)
        self.callbacks.on_log(self, record)

    def _fail_unhealthy(self, problem: str, reading: HealthReading,
                        micro_batches: list[MicroBatch] | None) -> None:
        culprit = None
        if micro_batches:  # replay this step's last micro-batch forward to find where NaN/Inf first shows
            culprit = first_nonfinite_in(self.model, self.forward, micro_batches[-1], self.device,
                                         autocast(self.precision, self.device))
        if culprit:
            problem += f" First non-finite output on this step's last micro-batch: {culprit[0]} ({culprit[1]})."
        self.run_dir.log_event("nonfinite", problem, severity="error",
                               step=reading.first_nonfinite_step or self.step,
                               evidence=reading.evidence(culprit[0] if culprit else None,
                                                         lr=self.scheduler.get_last_lr()[0]))
        raise TrainingError(problem)

    def _finish(self, started: float) -> dict[str, Any]:
        """The final writes, in an order that leaves a consistent run at every instant: the last checkpoint
        and a `running` summary of its step (resumable), then the weights, then the `completed` summary.
        A signal during them is held until they are done; a second Ctrl-C, or a kill, leaves the run
        resumable from the last checkpoint, and the resume ends with the same weights."""
        # a peer lost during the final (collective) save, or a disk that fills, fails the run like a step does
        with self._ending_recorded(started, saving=True):
            with GracefulStop():  # the run stops anyway: a first signal must not cut the final save
                summary = self._final_writes(started)
        self.callbacks.on_fit_end(self, summary)
        return summary

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
            self.callbacks.on_fit_end(self, self._write_summary("stopped", started, message=message))
            raise
        except BaseException as error:
            self._fail(error, started, during_step=self.step if saving else self.step + 1)

    def _fail(self, error: BaseException, started: float, *, during_step: int) -> NoReturn:
        """Record why the run failed (the summary says `failed` with the cause), then raise it."""
        failure = peer_lost(error, self.ranks, during_step) or error  # not the model's fault: say whose
        summary = self._write_summary("failed", started, message=record_failure(self.run_dir, failure, self.step))
        self.callbacks.on_fit_end(self, summary)
        if failure is error:
            raise error
        raise failure from error

    def _final_writes(self, started: float) -> dict[str, Any]:
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
                        device=str(self.device), precision=self.precision, tf32=self.tf32,
                        task=self.profile.to_dict() if self.profile is not None else None)

