"""Peak memory of one training step, traced on fake tensors: no GPU, and no memory for the model.

The step traced is the Trainer's own (train/step.py's TrainStep, built by `build_train_step` from the
Trainer's optimizer, loss and scaler factories), so the plan estimates what `trainwise train` runs. The
model and the batches are built under torch's FakeTensorMode, so every tensor has a shape, a dtype and a
(meta) storage but no data. Two optimizer steps (the first creates the optimizer state; the second is the
steady state, where with accumulation the gradients of one micro-batch are alive during the next forward)
run under `AllocationTracker`, a TorchDispatchMode that sees every op's outputs, counts each new storage
once and subtracts it when Python frees it, exactly the lifetimes the real allocator sees (the approach of
torch's MemTracker, re-done in a few lines for every torch we support, our categories and rounding).

What a trace cannot see, accounted for elsewhere: per-device fixed costs (CUDA context, cuBLAS/cuDNN
workspaces, fragmentation: advise.py); buffers kernels allocate inside themselves (workspaces.py, which
bounds from above what it cannot measure). The CUDA caching allocator's 512-byte rounding is applied here.

Fake CUDA tensors need a CUDA build of torch, so the trace always runs on CPU fake tensors; device
differences are applied by `TrainingStep.device_kind`: rounding, and where the batches live (on a GPU only
the micro-batch being computed is on the device; on a CPU the whole group the Trainer holds is).
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only

from trainwise.config import OptimConfig
from trainwise.plan.fake_build import (build_faked, build_on_meta, dense_gradients, into_mode,
                                       largest_module_parameter_bytes, make_batch)
from trainwise.plan.flops import FlopTally
from trainwise.plan.input_buffers import GradientBuffers
from trainwise.plan.optimizers import PLANNED_OPTIMIZERS
from trainwise.plan.step_phases import label_gradients, region_now, run_labelled
from trainwise.train.optim import build_optimizer
from trainwise.train.step import StepSettings, TrainStep

DeviceKind = Literal["cpu", "cuda"]
Category = Literal["parameters", "gradients", "optimizer_state", "activations", "temporaries"]
CATEGORIES: tuple[Category, ...] = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")

# c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize = 512; every block is a multiple of it.
CUDA_ALLOCATION_ROUNDING = 512


@dataclass(frozen=True)
class TrainingStep:
    """Everything about one training step that decides its memory, independent of where it runs."""

    build_model: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    input_dtype: torch.dtype = torch.float32
    task: Literal["classification", "regression"] = "classification"
    num_classes: int | None = None
    micro_batch_size: int = 32
    accumulation_steps: int = 1
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    optimizer_args: dict[str, Any] = field(default_factory=dict)
    grad_clip_norm: float | None = None
    label_smoothing: float = 0.0
    device_kind: DeviceKind = "cpu"
    # Token models read integer inputs; their embeddings need the index range.
    vocabulary_size: int | None = None
    # Per-sample target shape: () for one label per sample, (positions,) for a label per position
    # (next-item recommenders, token models)
    target_shape: tuple[int, ...] = ()
    # Language models (plan/llm_step.py): dict batches of input_ids/labels/position_ids of input_shape (T,),
    # the model built on the meta device outside the fake mode (casts, peft wrappers and tied weights then
    # work; the trace converts its tensors), and the step's chunked loss (StepSettings.loss_chunk_size).
    token_batches: bool = False
    build_on_meta: bool = False
    loss_chunk_size: int | None = None
    count_flops: bool = True  # False: skip the FLOP-counting pass (a trace read for its memory only)

    def at_micro_batch(self, micro_batch_size: int) -> "TrainingStep":
        return replace(self, micro_batch_size=micro_batch_size)

    def on(self, device_kind: DeviceKind) -> "TrainingStep":
        return replace(self, device_kind=device_kind)


@dataclass(frozen=True)
class StepTrace:
    """What one traced training step needs: the peak and its split, bytes, FLOPs and ops."""

    micro_batch_size: int
    peak_bytes: int
    breakdown: dict[str, int]  # category -> bytes live at the peak
    micro_batch_peak_bytes: int  # highest point during forward/backward: grows with the micro-batch
    optimizer_peak_bytes: int  # highest point during clip + optimizer step: independent of it
    parameter_count: int  # trainable (what the optimizer updates)
    parameter_bytes: int
    largest_module_parameter_bytes: int  # FSDP gathers one module's full parameters at a time
    optimizer_state_bytes: int
    micro_batch_flops: int  # forward + backward (+ recompute) of one micro-batch
    flops_by_op: dict[str, int]
    micro_batch_bytes_written: int  # sum of op outputs of one micro-batch: the memory-traffic estimate
    micro_batch_ops: int  # aten ops of one micro-batch: each is at least one kernel launch on a GPU
    optimizer_bytes_written: int  # ... of clipping + the optimizer step + zero_grad
    optimizer_ops: int
    device_kind: DeviceKind
    precision: str
    bounded_ops: tuple[str, ...] = ()  # CPU kernels whose hidden buffers are an upper bound, not measured
    peak_where: str = ""  # "forward of model.layers.3.mlp", "backward", "optimizer step"
    total_parameter_count: int = 0  # every parameter once, frozen ones included
    # each part's peak and its split: forward/backward ("micro_batches") and the optimizer step ("optimizer")
    part_breakdowns: dict[str, dict[str, int]] = field(default_factory=dict)
    part_where: dict[str, str] = field(default_factory=dict)


# ---- the step itself: the Trainer's own, traced here and measured by the probe and the benchmark ----------

def build_train_step(step: TrainingStep, model: nn.Module, device: torch.device,
                     to_device: Callable[[torch.Tensor], torch.Tensor] | None = None) -> TrainStep:
    """train/step.py's TrainStep with `step`'s settings, assembled as the Trainer's is (TrainStep.from_settings,
    which TrainStep.from_config calls): its optimizer (fused, decay groups), its loss, its scaler, its clipping."""
    if step.optimizer in PLANNED_OPTIMIZERS:  # stand-ins with the real one's memory (plan/optimizers.py)
        optimizer = PLANNED_OPTIMIZERS[step.optimizer](model, step.optimizer_args)
    else:
        optimizer = build_optimizer(model, OptimConfig(name=step.optimizer, **step.optimizer_args))
    settings = StepSettings(precision=step.precision, task=step.task, grad_clip_norm=step.grad_clip_norm,
                            label_smoothing=step.label_smoothing, loss_chunk_size=step.loss_chunk_size)
    return TrainStep.from_settings(model, optimizer, settings, device=device, to_device=to_device)


def traced_micro_batches(step: TrainingStep) -> int:
    """Micro-batches computed per traced step. From the second on, each one meets the same memory (the
    gradients of the earlier ones alive, its own activations), so two stand for any number of them."""
    return min(step.accumulation_steps, 2)


# ---- the tracker -----------------------------------------------------------------------------------------

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
        self.region = ""  # step_phases.REGIONS
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


# Kernel-internal memory of the CPU (oneDNN reorders and scratchpads, ATen's temporaries): workspaces.py
from trainwise.plan.workspaces import cpu_im2col_workspace, hidden_workspace_for  # noqa: E402,F401


# ---- tracing -----------------------------------------------------------------------------------------------

def trace_step(step: TrainingStep) -> StepTrace:
    """Trace two optimizer steps of the Trainer's TrainStep on fake tensors (the first creates the
    optimizer state, the second is the steady state); the peak over both, split by category."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    rounding = CUDA_ALLOCATION_ROUNDING if step.device_kind == "cuda" else 1
    tracker = AllocationTracker(rounding, hidden_workspace_for(step))
    flops = FlopTally()
    # On a GPU each micro-batch is copied to the device just before its forward and the host batches
    # are not device memory; on a CPU the Trainer's whole group of micro-batches is the device's.
    to_device = (lambda t: t.clone()) if step.device_kind == "cuda" else (lambda t: t)
    built = build_on_meta(step) if step.build_on_meta else None
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        model = dense_gradients(into_mode(built if built is not None else build_faked(step), mode))
        del built
        host_batches = [[make_batch(step) for _ in range(step.accumulation_steps)] for _ in range(2)]
        with tracker:
            for tensor in (*model.parameters(), *model.buffers()):
                tracker.track(tensor, "parameters")
            train_step = build_train_step(step, model, torch.device("cpu"), to_device)
            label_gradients(tracker, train_step.parameters)
            while host_batches:  # the second step is the steady state: its ops and bytes are the step's
                ops_before, written_before = dict(tracker.ops), dict(tracker.bytes_written)
                batches = host_batches.pop(0)
                run_labelled(tracker, train_step, batches[:traced_micro_batches(step)],
                             batches if step.device_kind == "cpu" else [])
            state_bytes = sum(value.untyped_storage().nbytes() for state in train_step.optimizer.state.values()
                              for value in state.values() if isinstance(value, torch.Tensor))
        # FLOPs in a pass of their own: FlopCounterMode's module hooks keep checkpointed tensors alive
        if step.count_flops:
            with flops:
                train_step([make_batch(step)])
    micro_batches = traced_micro_batches(step)
    ops = {part: tracker.ops[part] - ops_before[part] for part in ops_before}
    written = {part: tracker.bytes_written[part] - written_before[part] for part in written_before}
    worst = max(tracker.peak, key=tracker.peak.get)
    return StepTrace(
        micro_batch_size=step.micro_batch_size,
        peak_bytes=tracker.peak[worst],
        breakdown=tracker.live_at(tracker.peak_time[worst]),
        micro_batch_peak_bytes=tracker.peak["micro_batches"],
        optimizer_peak_bytes=tracker.peak["optimizer"],
        parameter_count=sum(p.numel() for p in train_step.parameters),
        parameter_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
        largest_module_parameter_bytes=largest_module_parameter_bytes(model),
        optimizer_state_bytes=state_bytes,
        micro_batch_flops=flops.total,
        flops_by_op=dict(flops.by_op),
        micro_batch_bytes_written=round(written["micro_batches"] / micro_batches),
        micro_batch_ops=round(ops["micro_batches"] / micro_batches),
        optimizer_bytes_written=written["optimizer"],
        optimizer_ops=ops["optimizer"],
        device_kind=step.device_kind,
        precision=step.precision,
        bounded_ops=tuple(sorted(tracker.bounded_ops)),
        peak_where=tracker.peak_where[worst],
        total_parameter_count=sum(p.numel() for p in model.parameters()),
        part_breakdowns={part: tracker.live_at(tracker.peak_time[part]) for part in tracker.peak},
        part_where=dict(tracker.peak_where),
    )
