"""The step the planner traces, described by what decides its memory (TrainingStep, independent of where it
runs), and what one trace of it yields (StepTrace): plain data that memory.py fills and job/llm_estimate read."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import nn

DeviceKind = Literal["cpu", "cuda"]


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
    # The built-in gpt attends per document from lengths the loader reads on the host (data/batch.py); a traced
    # batch carries them (one document a row, as a full pack), since fake position ids cannot be read.
    host_document_lengths: bool = False
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
