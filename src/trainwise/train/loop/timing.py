"""Where step time goes: waiting for data vs computing. The device is synchronised only when a log line
is written, so measuring costs nothing between log lines. Validation and checkpoints are not step time: the
loop runs them `paused()`, so the log interval after a validation pass reports the steps' own rate."""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import torch

from trainwise.train.callbacks.token_rates import TokenFigures, tokens_in
from trainwise.data.batch import MicroBatch

T = TypeVar("T")


class StepTimer:
    def __init__(self, device: torch.device, figures: TokenFigures | None = None):
        self.device = device
        self.figures = figures  # token batches: tokens/s -> FLOPs per token and MFU
        self.seq_len = 0
        self._reset(time.perf_counter())

    def _reset(self, now: float) -> None:
        self.interval_start = now
        self.data_wait = 0.0
        self.steps = 0
        self.samples = 0
        self.tokens = 0
        self.loss_sum: torch.Tensor | float = 0.0

    def timed(self, iterator: Iterator[T]) -> Iterator[T]:
        """Pass items through, adding the time spent waiting for each one to the data wait."""
        while True:
            start = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            self.data_wait += time.perf_counter() - start
            yield item

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the time spent inside out of the current interval (a validation pass, a checkpoint)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.interval_start += time.perf_counter() - start

    def step_done(self, loss: torch.Tensor, samples: int, micro_batches: Sequence[MicroBatch] = ()) -> None:
        self.steps += 1
        self.samples += samples
        tokens, seq_len = tokens_in(micro_batches)  # token batches: the real (non-padding) tokens
        self.tokens += tokens
        self.seq_len = seq_len or self.seq_len
        self.loss_sum = self.loss_sum + loss  # stays on the device: no sync

    def flush(self) -> dict[str, float]:
        """Synchronise, summarise the interval since the last flush, start a new one."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        wall = max(now - self.interval_start, 1e-9)
        steps = max(self.steps, 1)
        loss = float(self.loss_sum) / steps
        record = {
            "loss": loss,
            "samples_per_s": self.samples / wall,
            "step_time_s": wall / steps,
            "data_wait_s": self.data_wait / steps,
            "compute_s": (wall - self.data_wait) / steps,
            "data_wait_fraction": min(1.0, self.data_wait / wall),
        }
        if self.tokens:
            record["tokens_per_s"] = self.tokens / wall
            if self.figures is not None:
                record.update(self.figures(record["tokens_per_s"], self.seq_len))
        self._reset(now)
        return record
