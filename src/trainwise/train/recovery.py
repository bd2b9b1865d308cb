"""Out of memory inside a step: what to change, one thing at a time, so the run goes on unchanged.

The effective batch (`train.batch_size`) is what the optimizer sees; the micro-batch is only how it is
cut. Halving the micro-batch and accumulating twice as many gives the same gradient over the same samples,
so the optimizer's trajectory does not change — only the step gets slower. At a micro-batch of 1 the next
lever is gradient checkpointing (the built-in models have the switch); after that, the job does not fit
this device and the advice is the planner's.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class OomChange:
    """The one thing changed after an out-of-memory error, as an event records it."""

    kind: str  # "micro_batch" | "gradient_checkpointing"
    message: str
    evidence: dict


def smaller_micro_batch(current: int, per_rank_batch: int) -> int | None:
    """The largest micro-batch at most half of `current` that divides the per-rank batch, or None at 1."""
    if current <= 1:
        return None
    return max(size for size in range(1, current // 2 + 1) if per_rank_batch % size == 0)


def can_checkpoint(model: nn.Module) -> bool:
    """Whether the model has a gradient-checkpointing switch that is off (the built-in models do)."""
    return getattr(model, "gradient_checkpointing", None) is False


def out_of_memory_advice(step: int, micro_batch_size: int, precision: str) -> str:
    cheaper = "" if precision in ("bf16", "fp16") else "train.precision=bf16 (Ampere or newer) or fp16, "
    return (f"out of memory at step {step} even with micro-batch {micro_batch_size} and gradient checkpointing: "
            f"this job does not fit this device. Try {cheaper}a card with more memory (`trainwise plan RECIPE` "
            "lists the ones it fits), or shard the model over several cards (FSDP).")
