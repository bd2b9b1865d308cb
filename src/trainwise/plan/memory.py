"""Peak memory of one training step, traced on fake tensors: no GPU, and no memory for the model.

The step traced is the Trainer's own (train/step/train_step.py's TrainStep, built by `build_train_step` from the
Trainer's optimizer, loss and scaler factories), so the plan estimates what `trainwise train` runs. The
model and the batches are built under torch's FakeTensorMode, so every tensor has a shape, a dtype and a
(meta) storage but no data. Two optimizer steps (the first creates the optimizer state; the second is the
steady state, where with accumulation the gradients of one micro-batch are alive during the next forward)
run under `AllocationTracker` (allocation_tracker.py), a TorchDispatchMode that sees every op's outputs,
counts each new storage once and subtracts it when Python frees it, exactly the lifetimes the real allocator
sees (the approach of torch's MemTracker, re-done in a few lines for every torch we support, our categories
and rounding).

What a trace cannot see, accounted for elsewhere: per-device fixed costs (CUDA context, cuBLAS/cuDNN
workspaces, fragmentation: advise.py); buffers kernels allocate inside themselves (workspaces.py, which
bounds from above what it cannot measure). The CUDA caching allocator's 512-byte rounding is applied here.

Fake CUDA tensors need a CUDA build of torch, so the trace always runs on CPU fake tensors; device
differences are applied by `TrainingStep.device_kind`: rounding, and where the batches live (on a GPU only
the micro-batch being computed is on the device; on a CPU the whole group the Trainer holds is).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from trainwise.config import OptimConfig
from trainwise.plan.allocation_tracker import AllocationTracker
from trainwise.plan.fake_build import (build_faked, build_on_meta, dense_gradients, into_mode,
                                       largest_module_parameter_bytes, make_batch)
from trainwise.plan.flops import FlopTally
from trainwise.plan.optimizers import PLANNED_OPTIMIZERS
from trainwise.plan.step_phases import label_gradients, run_labelled
from trainwise.plan.traced_step import StepTrace, TrainingStep
from trainwise.plan.workspaces import hidden_workspace_for
from trainwise.train.step.optim import build_optimizer
from trainwise.train.step.train_step import StepSettings, TrainStep

# c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize = 512; every block is a multiple of it.
CUDA_ALLOCATION_ROUNDING = 512


# ---- the step itself: the Trainer's own, traced here and measured by the probe and the benchmark ----------

def build_train_step(step: TrainingStep, model: nn.Module, device: torch.device,
                     to_device: Callable[[torch.Tensor], torch.Tensor] | None = None) -> TrainStep:
    """train/step/train_step.py's TrainStep with `step`'s settings, assembled as the Trainer's is (TrainStep.from_settings,
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
