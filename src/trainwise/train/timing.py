"""Where step time goes: waiting for data vs computing. The device is synchronised only when a log line
is written, so measuring costs nothing between log lines."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TypeVar

import torch

T = TypeVar("T")


class StepTimer:
    def __init__(self, device: torch.device):
        self.device = device
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

    def step_done(self, loss: torch.Tensor, samples: int, tokens: int = 0) -> None:
        self.steps += 1
        self.samples += samples
        self.tokens += tokens  # token batches: the positions computed, from their shapes
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
        self._reset(now)
        return record
