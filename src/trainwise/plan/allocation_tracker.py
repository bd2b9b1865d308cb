"""The allocation tracker: a TorchDispatchMode that counts every live tensor storage of a traced step once,
subtracts it when Python frees it, and remembers the peak (and when, and where) for each part of the step and
each region of forward/backward (step_phases.py's hooks say which part and region the step is in)."""
from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only

from trainwise.plan.input_buffers import GradientBuffers

Category = Literal["parameters", "gradients", "optimizer_state", "activations", "temporaries"]
CATEGORIES: tuple[Category, ...] = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")
# The regions of a micro-batch in a model built of a stack of blocks (step_phases.py says where each begins)
FORWARD, HEAD, BLOCKS, BELOW = ("forward", "backward of the head", "backward of the blocks",
                                "backward below the blocks")
REGIONS = (FORWARD, HEAD, BLOCKS, BELOW)


def region_now(region: str) -> str:
    """The region the step is in: backward starts with the head, whether or not a hook saw the model's output
    (a Hugging Face model returns a ModelOutput, on which no tensor hook can be put)."""
    if region == FORWARD and torch._C._current_graph_task_id() != -1:
        return HEAD
    return region


class _Storage:
    __slots__ = ("nbytes", "category", "born", "died", "__weakref__")

    def __init__(self, nbytes: int, category: str, born: int):
        self.nbytes = nbytes
        self.category = category
        self.born = born
        self.died: int | None = None


class AllocationTracker(TorchDispatchMode):
    """Counts live tensor storages; remembers the peak, and when it was, for each part of the step.

    Every storage keeps its birth and death on an event clock, so the split of the peak is computed at the
    end with the final labels: the optimizer's moments (temporaries of its first step) are optimizer state."""

    def __init__(self, rounding: int = 1, hidden_workspace: Callable[..., tuple] | None = None):
        super().__init__()
        self.rounding = rounding
        self.hidden_workspace = hidden_workspace
        self.phase: str = "activations"
        self.region = ""  # one of REGIONS, set by step_phases.py's hooks
        self.in_optimizer = False
        self.total = self.clock = 0
        self.peak = {"micro_batches": 0, "optimizer": 0}
        self.peak_time = {"micro_batches": 0, "optimizer": 0}
        self.bytes_written = {"micro_batches": 0, "optimizer": 0}
        self.ops = {"micro_batches": 0, "optimizer": 0}
        self.peak_where = {"micro_batches": "", "optimizer": ""}
        self.module = ""  # the module whose forward last started (its qualified name)
        self._records: dict[int, _Storage] = {}  # id(storage) -> record, while the storage lives
        self.bounded_ops: set[str] = set()  # kernels whose workspace is a bound (workspaces.copies_bound)
        self._history: list[_Storage] = []
        self.buffers = GradientBuffers()  # autograd's in-place sums of two gradients (input_buffers.py)

    def enter_optimizer(self) -> None:
        self.phase = "temporaries"
        self.in_optimizer = True

    @property
    def part(self) -> str:
        return "optimizer" if self.in_optimizer else "micro_batches"

    def _size(self, storage: torch.UntypedStorage) -> int:
        return self._rounded(storage.nbytes())

    def _rounded(self, nbytes: int) -> int:
        return math.ceil(nbytes / self.rounding) * self.rounding if self.rounding > 1 else nbytes

    def track(self, tensor: torch.Tensor, category: str | None = None, nbytes: int | None = None) -> None:
        """Count a tensor's storage (once); with a category, (re)label it. `nbytes`: what the real kernel
        allocated for it, where a fake kernel says otherwise (workspaces.py)."""
        storage = tensor.untyped_storage()
        key = id(storage)
        record = self._records.get(key)
        if record is None:
            self.clock += 1
            size = self._size(storage) if nbytes is None else self._rounded(nbytes)
            record = _Storage(size, category or self._phase_now(), self.clock)
            self._records[key] = record
            self._history.append(record)
            self.total += record.nbytes
            self.bytes_written[self.part] += storage.nbytes() if nbytes is None else nbytes
            weakref.finalize(storage, self._free, key, record)
            self._check_peak()
        elif category is not None:
            record.category = category

    def _phase_now(self) -> str:
        # inside autograd's backward (also a checkpoint's recomputation): a temporary of backward
        if self.phase == "activations" and torch._C._current_graph_task_id() != -1:
            return "temporaries"
        return self.phase

    def _check_peak(self) -> None:
        # the part, and the region of forward/backward the step is in (step_phases.py)
        region = region_now(self.region)
        for part in (self.part, region) if region and not self.in_optimizer else (self.part,):
            if self.total > self.peak.get(part, 0):
                self.peak[part], self.peak_time[part], self.peak_where[part] = self.total, self.clock, self._where()

    def _where(self) -> str:
        """Where the step is: forward / backward / optimizer step, and in which module (innermost)."""
        if self.in_optimizer:
            return "optimizer step"
        if torch._C._current_graph_task_id() != -1:
            return "backward"
        return f"forward of {self.module}" if self.module else "forward"

    def workspace(self, nbytes: int) -> None:
        """A buffer a kernel allocates and frees inside itself, unseen by dispatch: only its peak counts."""
        self.clock += 1
        record = _Storage(nbytes, "temporaries", self.clock)
        self._history.append(record)
        self.total += nbytes
        self._check_peak()
        self.total -= nbytes
        self.clock += 1
        record.died = self.clock

    def _free(self, key: int, record: _Storage) -> None:
        if self._records.get(key) is record:
            del self._records[key]
        if record.died is not None:  # its memory became another tensor's (reused below)
            return
        self.clock += 1
        record.died = self.clock
        self.total -= record.nbytes

    def live_at(self, time: int) -> dict[str, int]:
        live = {category: 0 for category in CATEGORIES}
        for record in self._history:
            if record.born <= time and (record.died is None or record.died > time):
                live[record.category] += record.nbytes
        return live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "aten":  # fake tensors also route prim.device etc. here; those are no kernels
            self.ops[self.part] += 1
        reused = self.buffers.reused_operand(func, args, kwargs, out)
        if reused is not None and id(reused.untyped_storage()) in self._records:  # the result takes its memory
            self._free(-1, self._records[id(reused.untyped_storage())])
        memory = None
        if self.hidden_workspace is not None:  # the real kernel's outputs and what it allocates inside
            out, memory = self.hidden_workspace(func, args, kwargs, out)
        if memory is None:
            tree_map_only(torch.Tensor, self.track, out)
            return out
        leaves = tree_flatten(out)[0]
        for index, value in enumerate(leaves):
            if isinstance(value, torch.Tensor):
                real = memory.output_bytes[index] if index < len(memory.output_bytes) else None
                self.track(value, nbytes=real)
        if memory.workspace:
            self.workspace(memory.workspace)
            self.bounded_ops.update([str(func)] if memory.bounded else [])
        return out
