"""Count the calls that make the host wait for the device, per optimizer step.

On a GPU, `.item()`, `bool(t)`, `float(t)`, `.tolist()`, `.cpu()` and `.numpy()` on a device tensor block
the Python thread until every queued kernel has run: the GPU then idles while the host prepares the next
step. `HostSyncCounter` sees each such call through a TorchFunctionMode, so it works on the CPU too, where
the calls cost nothing but are the same calls. The data path's own host tensors (the sampler's permutation,
the DataLoader's indices, a token batch's document boundaries read before its copy, data/batch.py) are not
device syncs and are left out by where they are called from.

    counter = HostSyncCounter()
    with counter:
        trainer = Trainer(..., callbacks=[counter.step_marker()])
        trainer.fit()
    counter.by_step  # {step: ["item at trainer.py:123", ...]}
"""
from __future__ import annotations

import traceback

import torch
from torch.overrides import TorchFunctionMode

from trainwise.train.callbacks.base import Callback

SYNCING_CALLS = frozenset({torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__float__,
                           torch.Tensor.__int__, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy})
HOST_SIDE_CALLERS = ("trainwise/train/parallel/sampler.py", "torch/utils/data/", "trainwise/data/batch.py")


class HostSyncCounter(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.step = 0  # syncs are charged to the step that last ended (0: before the first)
        self.by_step: dict[int, list[str]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in SYNCING_CALLS:
            stack = traceback.extract_stack(limit=12)[:-1]
            if not any(part in frame.filename for frame in stack for part in HOST_SIDE_CALLERS):
                caller = next((f for f in reversed(stack) if "trainwise" in f.filename), stack[-1])
                where = f"{func.__name__} at {caller.filename.rsplit('/', 1)[-1]}:{caller.lineno}"
                self.by_step.setdefault(self.step, []).append(where)
        return func(*args, **(kwargs or {}))

    def step_marker(self) -> Callback:
        counter = self

        class StepMarker(Callback):
            def on_step_end(self, trainer) -> None:
                counter.step = trainer.step

        return StepMarker()

    def syncs_between(self, settle_points: set[int], steps: int) -> float:
        """Mean syncs per step over the steps that are not settle points (log, eval, checkpoint steps)."""
        others = [s for s in range(1, steps + 1) if s not in settle_points]
        return sum(len(self.by_step.get(s, ())) for s in others) / max(len(others), 1)
